-- Move a page's revisit state that does not read to the partition's dead letters.
-- KEYS: 1 revisits, 2 revisit requests, 3 revisit due, 4 dead
-- ARGV: 1 url, 2 reason, 3 partition label
-- Returns 0 (and does nothing) if the page has no state any more, else 1.
local state = redis.call("HGET", KEYS[1], ARGV[1])
if not state then
  return 0
end
local payload = redis.call("HGET", KEYS[2], ARGV[1])
redis.call("RPUSH", KEYS[4], cjson.encode({
  id = "revisit:" .. ARGV[1], partition = ARGV[3], payload = payload or cjson.null,
  reason = ARGV[2], deliveries = 0, state = state,
}))
redis.call("HDEL", KEYS[1], ARGV[1])
redis.call("HDEL", KEYS[2], ARGV[1])
redis.call("ZREM", KEYS[3], ARGV[1])
return 1
