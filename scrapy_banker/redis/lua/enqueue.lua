-- Dedup and enqueue in one step, so a URL is never "seen" without being queued.
-- KEYS: 1 queue (zset id -> score), 2 seen (set of fingerprints),
--       3 payloads (hash id -> payload), 4 meta (hash: seq, scores)
-- ARGV: 1 fingerprint, 2 payload, 3 priority, 4 dont_filter ("1"/"0")
-- Returns the new id, or false when the fingerprint was already seen.
local fp, payload, priority = ARGV[1], ARGV[2], tonumber(ARGV[3])
if ARGV[4] ~= "1" then
  if redis.call("SADD", KEYS[2], fp) == 0 then
    return false
  end
end
local seq = redis.call("HINCRBY", KEYS[4], "seq", 1)
local id = fp .. ":" .. seq
-- Higher priority first, FIFO among equals: -priority * 2^32 + seq (exact in a double).
local score = -priority * 4294967296 + seq
redis.call("ZADD", KEYS[1], score, id)
redis.call("HSET", KEYS[3], id, payload)
redis.call("HSET", KEYS[4], "s:" .. id, score)
return id
