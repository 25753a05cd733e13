-- (Included by the scripts that end a lease: ack, nack, deadletter, reap,
-- charge.)  The meta hash's fields of a request are declared in
-- scrapy_banker/redis/keys.py (META_FIELDS): while leased it has "d:" (its
-- deliveries), "c:" and "f:" (fetches begun, the delivery last marked),
-- "s:" (its priority), "e:" (the epoch it was leased at, counted in
-- "h:<epoch>") and, once charged to a budget, "b:".
--
-- unlease: take the request out of the leases and its epoch's count; false
-- (and nothing done) if it was not leased.  A counter at zero is deleted:
-- epochs come and go, their fields must not stay.
local function unlease(leases, meta, id)
  if redis.call("ZREM", leases, id) == 0 then return false end
  local e = redis.call("HGET", meta, "e:" .. id)
  if e and redis.call("HINCRBY", meta, "h:" .. e, -1) <= 0 then redis.call("HDEL", meta, "h:" .. e) end
  redis.call("HDEL", meta, "e:" .. id)
  return true
end
-- forget: the request ended (acked, dead-lettered, held over a budget):
-- its payload and every meta field of it go.  A budget charge ("b:") is
-- settled first by the caller (_budget.lua's refund, or kept by an ack).
local function forget(meta, payloads, id)
  redis.call("HDEL", payloads, id)
  redis.call("HDEL", meta, "b:" .. id, "d:" .. id, "s:" .. id, "e:" .. id, "c:" .. id, "f:" .. id)
end
