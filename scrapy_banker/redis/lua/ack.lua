-- Acknowledge processed requests: forget their lease, payload and counters.
-- KEYS: 1 leases, 2 payloads, 3 meta.  ARGV: ids.  Returns how many were leased.
local acked = 0
for i = 1, #ARGV do
  local id = ARGV[i]
  acked = acked + redis.call("ZREM", KEYS[1], id)
  redis.call("HDEL", KEYS[2], id)
  redis.call("HDEL", KEYS[3], "d:" .. id, "s:" .. id)
end
return acked
