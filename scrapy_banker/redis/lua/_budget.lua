-- (Included by the scripts that end a request for good.)  Budgets: a leased
-- request charged to its host's budget (charge.lua) carries "b:<id>" = host
-- TAB topic TAB crawl-flag in the partition's meta; the host's pages charged
-- are "u:<host>" there, a topic's and the crawl's in the crawl-wide budget
-- hash (a single server only: another slot on a cluster).  The charge stays
-- with the request while it goes back to the queue (nack, reap) and comes
-- back (charge.lua finds it and charges nothing), so a page a dead worker
-- fetched is never replaced by another one.  An ack keeps it; an ack with
-- "r" (a copy of the request was queued), a dead letter or a purge gives it
-- back.
local function refund(meta, id, global)
  local b = redis.call("HGET", meta, "b:" .. id)
  if not b then return end
  redis.call("HDEL", meta, "b:" .. id)
  local host, topic, crawl = string.match(b, "^([^\t]*)\t([^\t]*)\t(%d)$")
  if not host then return end
  if redis.call("HINCRBY", meta, "u:" .. host, -1) <= 0 then redis.call("HDEL", meta, "u:" .. host) end
  if global then
    if topic ~= "" then redis.call("HINCRBY", global, "t:" .. topic, -1) end
    if crawl == "1" then redis.call("HINCRBY", global, "c", -1) end
  end
end
