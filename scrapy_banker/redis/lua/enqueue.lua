-- Dedup and enqueue in one step, so a URL is never "seen" without being queued,
-- and two workers queueing the same URL at once queue it once.
-- KEYS: 1 levels (zset priority -> -priority; the requests wait in the list
--       levels .. ":" .. priority, as "<id> <payload>"), 2 seen (set of
--       fingerprints), 3 payloads (unused here), 4 meta (hash: seq, n queued),
--       5 bloom (RedisBloom filter or bit-array string), 6 the hash that keeps
--       a bit array's geometry (the partition's meta on Redis Cluster, where
--       each partition has its filter; the shard's on one server, where the
--       filters are shards of one crawl-wide filter)
-- ARGV: 1 fingerprint, 2 payload, 3 priority (an integer, as text), 4 dont_filter ("1"/"0"),
--       5 dedup: "set" | "bf" (native; 6 capacity, 7 error)
--                | "lua" (bit array; 6 bits m, 7 hashes k, 8 h1, 9 h2,
--                         10 capacity n of the first layer)
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
      -- A scalable Bloom filter (Almeida et al.) in one string, so it stays in
      -- the partition's cluster slot: layer j holds n*2^j items at error
      -- p/2^j (k+j hashes, m*2^j*(k+j)/k bits), laid end to end.  A
      -- partition that gets far more than its share of the crawl (one huge
      -- host) adds layers instead of filling up: its error stays below 2p.
      -- The geometry is fixed when the filter is created: a worker started
      -- with other settings keeps reading the same bits.
      local m, k, n
      local g = redis.call("HMGET", KEYS[6], "bf", "bfc", "bfl", "bfn")
      if g[1] then
        local gm, gk = string.match(g[1], "^(%d+):(%d+)$")
        m, k = tonumber(gm), tonumber(gk)
      else
        m, k = tonumber(ARGV[6]), tonumber(ARGV[7])
        redis.call("HSET", KEYS[6], "bf", ARGV[6] .. ":" .. ARGV[7])
        -- A new filter: SETBIT on a missing key allocates the string at
        -- exactly its length, zeroed (growing it bit by bit would allocate
        -- greedily, up to twice the bytes it needs).
        redis.call("SETBIT", KEYS[5], m - 1, 0)
      end
      n = tonumber(g[2] or ARGV[10])
      if not g[2] then
        redis.call("HSET", KEYS[6], "bfc", n)
      end
      local layers = tonumber(g[3] or "1")
      local filled = tonumber(g[4] or "0")
      -- Kirsch-Mitzenmacher: bit i of layer j is (h1 + i*h2) mod m_j; h1, h2 <
      -- 2^32 and i < 64 keep every number below 2^38, exact in a double.
      local h1, h2 = tonumber(ARGV[8]), tonumber(ARGV[9])
      local offset, mj, kj = 0, m, k
      for j = 0, layers - 1 do
        mj, kj = math.ceil(m * 2 ^ j * (k + j) / k), k + j
        local all = true
        for i = 0, kj - 1 do
          if redis.call("GETBIT", KEYS[5], offset + (h1 + i * h2) % mj) == 0 then
            all = false
            break
          end
        end
        if all then
          return false
        end
        if j < layers - 1 then
          offset = offset + mj
        end
      end
      for i = 0, kj - 1 do
        redis.call("SETBIT", KEYS[5], offset + (h1 + i * h2) % mj, 1)
      end
      filled = filled + 1
      local next_m = math.ceil(m * 2 ^ layers * (k + layers) / k)
      if filled > n * 2 ^ (layers - 1) and offset + mj + next_m <= 4294967296 then
        -- The last layer is full: append the next one, zeroed, at its exact
        -- length (past 1 MB, growing the string adds 1 MB of slack at most).
        local bits = offset + mj + next_m
        local bytes = math.ceil(bits / 8)
        if bytes > 1048576 then
          redis.call("SETBIT", KEYS[5], bits - 1, 0)
        else
          local current = redis.call("GET", KEYS[5])
          redis.call("SET", KEYS[5], current .. string.rep("\0", bytes - #current))
        end
        redis.call("HSET", KEYS[6], "bfl", layers + 1, "bfn", 0)
      else
        redis.call("HSET", KEYS[6], "bfn", filled)
      end
    end
  end
end
local seq = redis.call("HINCRBY", KEYS[4], "seq", 1)
-- The id is the partition's sequence number alone: the fingerprint is in the
-- seen set already, and each byte here is paid per queued request.  A list
-- per priority keeps FIFO among equals and packs its entries (a listpack per
-- 8 KB node) a few bytes apart.
if redis.call("RPUSH", KEYS[1] .. ":" .. ARGV[3], seq .. " " .. payload) == 1 then
  redis.call("ZADD", KEYS[1], -priority, ARGV[3])
end
redis.call("HINCRBY", KEYS[4], "n", 1)
-- No per-request meta while it waits: its priority is kept ("s:") only once
-- it is leased (pop.lua), for a nack or the reaper to put it back in its place.
return tostring(seq)
