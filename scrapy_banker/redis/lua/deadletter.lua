-- Move one leased request straight to the dead-letter list (e.g. a malformed payload).
-- KEYS: 1 leases, 2 payloads, 3 meta, 4 dead, [5 the crawl-wide budget hash].
-- #include _budget
--  ARGV: 1 id, 2 reason, 3 partition label
-- Returns 0 (and does nothing) if the request is not leased any more.
local id = ARGV[1]
if redis.call("ZREM", KEYS[1], id) == 0 then
  return 0
end
local e = redis.call("HGET", KEYS[3], "e:" .. id)
-- A counter at zero is deleted: epochs come and go, their fields must not stay.
if e and redis.call("HINCRBY", KEYS[3], "h:" .. e, -1) <= 0 then redis.call("HDEL", KEYS[3], "h:" .. e) end
refund(KEYS[3], id, KEYS[5])
local payload = redis.call("HGET", KEYS[2], id)
redis.call("RPUSH", KEYS[4], cjson.encode({
  id = id, partition = ARGV[3], payload = payload or cjson.null, reason = ARGV[2],
  deliveries = tonumber(redis.call("HGET", KEYS[3], "d:" .. id) or "0"),
}))
redis.call("HDEL", KEYS[2], id)
redis.call("HDEL", KEYS[3], "d:" .. id, "s:" .. id, "e:" .. id, "c:" .. id, "f:" .. id)
return 1
