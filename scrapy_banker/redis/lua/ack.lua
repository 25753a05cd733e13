-- Acknowledge processed requests: forget their lease, payload and counters.
-- KEYS: 1 leases, 2 payloads, 3 meta.  ARGV: ids, or id#delivery tokens.  Returns how many were leased.
-- Idempotent, and an ack that arrives after the lease expired and the request
-- went back to the queue changes nothing: it will be delivered again
-- (at-least-once), never lost.
local acked = 0
for i = 1, #ARGV do
  local id, token = string.match(ARGV[i], "^(.*)#(%d+)$")
  if not id then id = ARGV[i] end
  -- "id#n" acts only on delivery n: a holder whose lease expired and was
  -- handed to another node must not ack or requeue that node's delivery.
  if token and redis.call("HGET", KEYS[3], "d:" .. id) ~= token then id = nil end
  if id and redis.call("ZREM", KEYS[1], id) == 1 then
    acked = acked + 1
    local e = redis.call("HGET", KEYS[3], "e:" .. id)
    if e then redis.call("HINCRBY", KEYS[3], "h:" .. e, -1) end
    redis.call("HDEL", KEYS[2], id)
    redis.call("HDEL", KEYS[3], "d:" .. id, "s:" .. id, "e:" .. id)
  end
end
return acked
