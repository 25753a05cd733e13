-- Lease up to N requests of a partition to the node that owns it (at-least-once).
-- KEYS: 1 queue, 2 leases (zset id -> expiry ms), 3 payloads, 4 meta, 5 owner (string)
-- Meta of a leased id: d: deliveries, e: epoch, s: its queue score (deleted at ack).
-- ARGV: 1 node, 2 epoch, 3 lease ttl ms, 4 count
-- Returns {err} NOTOWNER if the caller does not own the partition at that epoch,
-- {err} BUSY while leases taken at an older epoch (a previous owner's requests
-- still in flight) are outstanding -- so a host is never fetched by two nodes
-- at once across a hand-over -- else a flat list: id1, payload1, deliveries1, ...
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
local popped = redis.call("ZPOPMIN", KEYS[1], tonumber(ARGV[4]))
local out = {}
for i = 1, #popped, 2 do
  local id = popped[i]
  redis.call("ZADD", KEYS[2], expiry, id)
  local n = redis.call("HINCRBY", KEYS[4], "d:" .. id, 1)
  -- Its queue score, kept only while leased: a nack or the reaper puts it back there.
  redis.call("HSET", KEYS[4], "e:" .. id, epoch, "s:" .. id, popped[i + 1])
  redis.call("HINCRBY", KEYS[4], "h:" .. epoch, 1)
  out[#out + 1] = id
  out[#out + 1] = redis.call("HGET", KEYS[3], id) or ""
  out[#out + 1] = n
end
return out
