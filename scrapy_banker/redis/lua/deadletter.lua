-- Move one leased request straight to the dead-letter list (e.g. a malformed payload).
-- KEYS: 1 leases, 2 payloads, 3 meta, 4 dead, [5 the crawl-wide budget hash].
-- #include _budget
-- #include _lease
--  ARGV: 1 id, 2 reason, 3 partition label
-- Returns 0 (and does nothing) if the request is not leased any more.
local id = ARGV[1]
if not unlease(KEYS[1], KEYS[3], id) then
  return 0
end
refund(KEYS[3], id, KEYS[5])
local payload = redis.call("HGET", KEYS[2], id)
redis.call("RPUSH", KEYS[4], cjson.encode({
  id = id, partition = ARGV[3], payload = payload or cjson.null, reason = ARGV[2],
  deliveries = tonumber(redis.call("HGET", KEYS[3], "d:" .. id) or "0"),
}))
forget(KEYS[3], KEYS[2], id)
return 1
