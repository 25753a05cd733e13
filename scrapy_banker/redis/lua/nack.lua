-- Give leased requests back unprocessed (a clean stop, a lost partition): they
-- go back to the queue at their old place and the delivery does not count.
-- KEYS: 1 queue, 2 leases, 3 meta.  ARGV: ids, or id#delivery tokens.  Returns how many were leased.
local n = 0
for i = 1, #ARGV do
  local id, token = string.match(ARGV[i], "^(.*)#(%d+)$")
  if not id then id = ARGV[i] end
  -- "id#n" acts only on delivery n: a holder whose lease expired and was
  -- handed to another node must not ack or requeue that node's delivery.
  if token and redis.call("HGET", KEYS[3], "d:" .. id) ~= token then id = nil end
  if id and redis.call("ZREM", KEYS[2], id) == 1 then
    n = n + 1
    local e = redis.call("HGET", KEYS[3], "e:" .. id)
    if e then redis.call("HINCRBY", KEYS[3], "h:" .. e, -1) end
    redis.call("HINCRBY", KEYS[3], "d:" .. id, -1)
    redis.call("ZADD", KEYS[1], redis.call("HGET", KEYS[3], "s:" .. id) or "0", id)
    redis.call("HDEL", KEYS[3], "e:" .. id, "s:" .. id)
  end
end
return n
