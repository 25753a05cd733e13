-- Give expired leases back to the queue, or dead-letter them after too many
-- deliveries whose fetch began.
-- KEYS: 1 levels, 2 leases, 3 payloads, 4 meta, 5 dead (list), [6 the crawl-wide budget hash]
-- ARGV: 1 max deliveries, 2 limit, 3 partition label
-- Returns {requeued, dead}.
-- #include _budget
-- #include _lease
-- #include _putback
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call("ZRANGEBYSCORE", KEYS[2], "-inf", now, "LIMIT", 0, tonumber(ARGV[2]))
local requeued, dead = 0, 0
-- Last first: each goes back to the head of its list, so they keep their order.
for i = #expired, 1, -1 do
  local id = expired[i]
  unlease(KEYS[2], KEYS[4], id)
  local n = tonumber(redis.call("HGET", KEYS[4], "d:" .. id) or "0")
  -- Deliveries count once their fetch began (start.lua): one that only sat
  -- in the buffer of a worker that died or froze is no sign of a poison
  -- request.  Three times the limit of deliveries in all stops a request
  -- whose holders keep dying before they can say it started.
  local fetched = tonumber(redis.call("HGET", KEYS[4], "c:" .. id) or "0")
  local max = tonumber(ARGV[1])
  if fetched >= max or n >= 3 * max then
    -- A dead letter like any other (deadletter.lua): a budget page it was
    -- charged is given back, or a crawl budget's pages done would never
    -- reach the pages charged.
    refund(KEYS[4], id, KEYS[6])
    local payload = redis.call("HGET", KEYS[3], id)
    redis.call("RPUSH", KEYS[5], cjson.encode({
      id = id, partition = ARGV[3], deliveries = n, payload = payload or cjson.null,
      reason = "lease expired after " .. n .. " deliveries",
    }))
    forget(KEYS[4], KEYS[3], id)
    dead = dead + 1
  else
    -- Its holder died or froze, maybe after the server answered: a budget
    -- page it was charged stays with it ("b:" record), so its next holder
    -- fetches it without a new charge and no other page takes its place.
    put_back(KEYS[1], KEYS[3], KEYS[4], id)
    requeued = requeued + 1
  end
end
return {requeued, dead}
