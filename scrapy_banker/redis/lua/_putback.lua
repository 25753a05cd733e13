-- (Included by nack.lua and reap.lua.)  Put a leased request back near the
-- head of its priority's list: ahead of what was queued after it, where it
-- was when it was popped.  Its payload was kept in the payloads hash while leased.
local function put_back(levels, payloads, meta, id)
  local level = redis.call("HGET", meta, "s:" .. id) or "0"
  local payload = redis.call("HGET", payloads, id) or ""
  local list, entry = levels .. ":" .. level, id .. " " .. payload
  -- Behind the requests given back before it that were queued before it
  -- (ids are the partition's sequence): FIFO holds across nacks and reaps.
  -- Only the first 16 are looked at.
  local mine, ahead = tonumber(id), {}
  if mine then ahead = redis.call("LRANGE", list, 0, 15) end
  local keep = #ahead
  for j, item in ipairs(ahead) do
    local other = tonumber(string.match(item, "^(%d+) "))
    if not other or other > mine then
      keep = j - 1
      break
    end
  end
  if keep > 0 then
    redis.call("LINSERT", list, "AFTER", ahead[keep], entry)
  elseif redis.call("LPUSH", list, entry) == 1 then
    redis.call("ZADD", levels, -tonumber(level), level)
  end
  redis.call("HINCRBY", meta, "n", 1)
  redis.call("HDEL", payloads, id)
  redis.call("HDEL", meta, "s:" .. id)
end
