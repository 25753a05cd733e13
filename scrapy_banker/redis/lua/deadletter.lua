-- Move one leased request straight to the dead-letter list (e.g. a malformed payload).
-- KEYS: 1 leases, 2 payloads, 3 meta, 4 dead.  ARGV: 1 id, 2 reason, 3 partition label
local id = ARGV[1]
local payload = redis.call("HGET", KEYS[2], id)
redis.call("ZREM", KEYS[1], id)
redis.call("RPUSH", KEYS[4], cjson.encode({
  id = id, partition = ARGV[3], payload = payload or cjson.null, reason = ARGV[2],
  deliveries = tonumber(redis.call("HGET", KEYS[3], "d:" .. id) or "0"),
}))
redis.call("HDEL", KEYS[2], id)
redis.call("HDEL", KEYS[3], "d:" .. id, "s:" .. id)
return 1
