-- Dedup and enqueue in one step, so a URL is never "seen" without being queued,
-- and two workers queueing the same URL at once queue it once.
-- KEYS: 1 queue (zset id -> score), 2 seen (set of fingerprints),
--       3 payloads (hash id -> payload), 4 meta (hash: seq, scores, bloom geometry),
--       5 bloom (RedisBloom filter or bit-array string)
-- ARGV: 1 fingerprint, 2 payload, 3 priority, 4 dont_filter ("1"/"0"),
--       5 dedup: "set" | "bf" (native; 6 capacity, 7 error)
--                | "lua" (bit array; 6 bits m, 7 hashes k, 8 h1, 9 h2)
-- Returns the new id, or false when the fingerprint was already seen.
local fp, payload, priority = ARGV[1], ARGV[2], tonumber(ARGV[3])
if ARGV[4] ~= "1" then
  local mode = ARGV[5]
  if mode == "set" or not mode then
    if redis.call("SADD", KEYS[2], fp) == 0 then
      return false
    end
  else
    -- A crawl switched from "set" keeps knowing what its set holds.
    if redis.call("SISMEMBER", KEYS[2], fp) == 1 then
      return false
    end
    if mode == "bf" then
      -- Creates the filter with the crawl's sizing on first use (BF.ADD would
      -- take the module's defaults); it scales by itself when full.
      local added = redis.call("BF.INSERT", KEYS[5], "CAPACITY", ARGV[6], "ERROR", ARGV[7],
                               "ITEMS", fp)
      if added[1] == 0 then
        return false
      end
    else
      -- The geometry is fixed when the filter is created: a worker started
      -- with other settings keeps reading the same bits.
      local m, k
      local geometry = redis.call("HGET", KEYS[4], "bf")
      if geometry then
        local gm, gk = string.match(geometry, "^(%d+):(%d+)$")
        m, k = tonumber(gm), tonumber(gk)
      else
        m, k = tonumber(ARGV[6]), tonumber(ARGV[7])
        redis.call("HSET", KEYS[4], "bf", ARGV[6] .. ":" .. ARGV[7])
      end
      -- Kirsch-Mitzenmacher: bit i is (h1 + i*h2) mod m; h1, h2 < 2^32 and
      -- i < 64 keep every number below 2^38, exact in a double.
      local h1, h2 = tonumber(ARGV[8]), tonumber(ARGV[9])
      local new = false
      for i = 0, k - 1 do
        if redis.call("SETBIT", KEYS[5], (h1 + i * h2) % m, 1) == 0 then
          new = true
        end
      end
      if not new then
        return false
      end
    end
  end
end
local seq = redis.call("HINCRBY", KEYS[4], "seq", 1)
local id = fp .. ":" .. seq
-- Higher priority first, FIFO among equals: -priority * 2^32 + seq (exact in a double).
local score = -priority * 4294967296 + seq
redis.call("ZADD", KEYS[1], score, id)
redis.call("HSET", KEYS[3], id, payload)
-- No per-request meta while it waits: its score is kept ("s:") only once it
-- is leased (pop.lua), for a nack or the reaper to put it back in its place.
return id
