-- Hand the pages of a partition due by now to its owner, to revisit (BANKER_RECRAWL).
-- KEYS: 1 owner (string), 2 revisit due (zset url -> due), 3 revisits (hash url -> state),
--       4 revisit requests (hash url -> payload)
-- ARGV: 1 node, 2 epoch, 3 now (POSIX seconds), 4 hold (s), 5 count
-- Fenced like pop.lua: {err} NOTOWNER unless the caller owns the partition at
-- that epoch.  Each page handed out is due again after the longer of the hold
-- and its own interval (a lease by postponement: a worker that dies before its
-- revisit is queued leaves the page to come due again; a revisit still waiting
-- in the queue when that time comes is sent again and the older copy is
-- superseded at the downloader).  Returns a flat list url1, state1, payload1,
-- ..., and last the earliest due time left ("" when none).
local owner = redis.call("GET", KEYS[1])
if owner ~= ARGV[1] .. "@" .. ARGV[2] then
  return redis.error_reply("NOTOWNER " .. tostring(owner))
end
local now = tonumber(ARGV[3])
local hold = tonumber(ARGV[4])
local due = redis.call("ZRANGEBYSCORE", KEYS[2], "-inf", ARGV[3], "LIMIT", 0, tonumber(ARGV[5]))
local out = {}
for _, url in ipairs(due) do
  local state = redis.call("HGET", KEYS[3], url)
  if not state then
    redis.call("ZREM", KEYS[2], url)  -- no state to revisit with: nothing to keep due
  else
    local wait = hold
    local ok, s = pcall(cjson.decode, state)
    if ok and type(s) == "table" then
      local interval = tonumber(s.interval)
      if interval and interval > wait then
        wait = interval
      end
    end
    redis.call("ZADD", KEYS[2], string.format("%.3f", now + wait), url)
    out[#out + 1] = url
    out[#out + 1] = state
    out[#out + 1] = redis.call("HGET", KEYS[4], url) or ""
  end
end
local first = redis.call("ZRANGE", KEYS[2], 0, 0, "WITHSCORES")
out[#out + 1] = first[2] or ""
return out
