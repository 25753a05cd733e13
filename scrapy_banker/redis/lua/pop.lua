-- Lease up to N requests of a partition to the node that owns it (at-least-once).
-- KEYS: 1 levels, 2 leases (zset id -> expiry ms), 3 payloads, 4 meta, 5 owner (string)
-- Meta of a leased id: d: deliveries, e: epoch, s: its priority (deleted at ack);
-- its payload waits in the payloads hash until the ack.
-- ARGV: 1 node, 2 epoch, 3 lease ttl ms, 4 count
-- Returns {err} NOTOWNER if the caller does not own the partition at that epoch,
-- {err} BUSY while leases taken at an older epoch (a previous owner's requests
-- still in flight) are outstanding -- so a host is never fetched by two nodes
-- at once across a hand-over -- else a flat list: id1, payload1, deliveries1,
-- ..., and last the requests still queued in the partition after this pop
-- (meta "n": the census that lets the owner lease its longest backlog first).
local owner = redis.call("GET", KEYS[5])
local epoch = ARGV[2]
if owner ~= ARGV[1] .. "@" .. epoch then
  return redis.error_reply("NOTOWNER " .. tostring(owner))
end
local leased = redis.call("ZCARD", KEYS[2])
if leased > 0 then
  local mine = tonumber(redis.call("HGET", KEYS[4], "h:" .. epoch) or "0")
  if leased > mine then
    return redis.error_reply("BUSY " .. (leased - mine))
  end
end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = now + tonumber(ARGV[3])
local want = tonumber(ARGV[4])
local out = {}
local function lease(id, payload, level)
  redis.call("ZADD", KEYS[2], expiry, id)
  redis.call("HSET", KEYS[3], id, payload)
  local n = redis.call("HINCRBY", KEYS[4], "d:" .. id, 1)
  redis.call("HSET", KEYS[4], "e:" .. id, epoch, "s:" .. id, level)
  out[#out + 1] = id
  out[#out + 1] = payload
  out[#out + 1] = n
end
local taken = 0
while taken < want do
  local top = redis.call("ZRANGE", KEYS[1], 0, 0)
  if #top == 0 then break end
  local level = top[1]
  local list = KEYS[1] .. ":" .. level
  local items = redis.call("LPOP", list, want - taken)
  if items then
    for _, item in ipairs(items) do
      local space = string.find(item, " ", 1, true) or (#item + 1)
      lease(string.sub(item, 1, space - 1), string.sub(item, space + 1), level)
      taken = taken + 1
    end
  end
  if redis.call("EXISTS", list) == 0 then
    redis.call("ZREM", KEYS[1], level)
  end
end
local left = tonumber(redis.call("HGET", KEYS[4], "n") or "0")
if taken > 0 then
  left = redis.call("HINCRBY", KEYS[4], "n", -taken)
  redis.call("HINCRBY", KEYS[4], "h:" .. epoch, taken)
end
out[#out + 1] = left
return out
