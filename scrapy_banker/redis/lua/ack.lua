-- Acknowledge processed requests: forget their lease, payload and counters.
-- KEYS: 1 leases, 2 payloads, 3 meta, [4 the crawl-wide budget hash].  ARGV: ids, or
-- id#delivery tokens ("id#deliveryr": the request was not fetched after all, its
-- budget page is given back).  Returns how many were leased.
-- #include _budget
-- #include _lease
-- Idempotent, and an ack that arrives after the lease expired and the request
-- went back to the queue changes nothing: it will be delivered again
-- (at-least-once), never lost.
local acked = 0
for i = 1, #ARGV do
  local id, token, back = string.match(ARGV[i], "^(.-)#(%d+)(r?)$")
  if not id then id = ARGV[i] end
  -- "id#n" acts only on delivery n: a holder whose lease expired and was
  -- handed to another node must not ack or requeue that node's delivery.
  if token and redis.call("HGET", KEYS[3], "d:" .. id) ~= token then id = nil end
  if id and unlease(KEYS[1], KEYS[3], id) then
    acked = acked + 1
    if back == "r" then
      refund(KEYS[3], id, KEYS[4])
    elseif KEYS[4] and string.sub(redis.call("HGET", KEYS[3], "b:" .. id) or "", -1) == "1" then
      -- A page charged to the crawl budget is done: the crawl ends when all are.
      redis.call("HINCRBY", KEYS[4], "d", 1)
    end
    forget(KEYS[3], KEYS[2], id)
  end
end
-- The partition drained: its meta is back to a few counters.  A hash that
-- once held a few hundred leases' fields stays a hash table (~500 bytes)
-- after they are deleted; written afresh it is a packed list again (~100).
-- Per partition that is little, but the crawl keeps it for good: at 10^6
-- URLs over 1,024 partitions it was 0.5 of the 2.5 bytes a Bloom-deduped
-- URL costs once the queue is empty (benchmarks/redis_scale.py).
if acked > 0 and redis.call("ZCARD", KEYS[1]) == 0 and redis.call("HGET", KEYS[3], "n") == "0"
    and redis.call("OBJECT", "ENCODING", KEYS[3]) == "hashtable"
    and redis.call("HLEN", KEYS[3]) <= 16 then
  local fields = redis.call("HGETALL", KEYS[3])
  redis.call("DEL", KEYS[3])
  redis.call("HSET", KEYS[3], unpack(fields))
end
return acked
