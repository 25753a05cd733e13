-- Charge leased requests to their budgets before they are fetched, or hold them.
-- KEYS: 1 leases, 2 meta, 3 payloads, 4 over (list), [5 the crawl-wide budget hash]
-- ARGV: per request "id#delivery TAB host TAB topic TAB host budget TAB topic
-- budget TAB crawl budget" (-1: no such budget).
-- Returns per request 1 (charged: fetch it), 0 (over a budget: moved to the
-- partition's over list, the lease released; release.lua puts it back) or -1
-- (not leased by that delivery any more: drop it).
-- Counting at the lease, in the partition's slot, is what makes a budget exact
-- under kill -9: a request whose holder dies keeps its page when the reaper
-- requeues it (reap.lua), and is not charged again when leased again; a dead
-- letter gives it back (_budget.lua).
-- Every leased request is counted, budget or not ("u:<host>", and with the
-- crawl-wide hash "t:<topic>" and "c"), so a budget set later counts the
-- pages fetched before it, as one given at the start does.
-- #include _lease
local global = KEYS[5]
local out = {}
for i = 1, #ARGV do
  local id, d, host, topic, hb, tb, cb = string.match(ARGV[i],
    "^(.-)#(%d+)\t([^\t]*)\t([^\t]*)\t(-?%d+)\t(-?%d+)\t(-?%d+)$")
  local result = -1
  if id and redis.call("HGET", KEYS[2], "d:" .. id) == d
      and redis.call("ZSCORE", KEYS[1], id) then
    hb, tb, cb = tonumber(hb), tonumber(tb), tonumber(cb)
    if redis.call("HEXISTS", KEYS[2], "b:" .. id) == 1 then
      result = 1  -- charged already (a resent batch)
    else
      local over = hb >= 0 and tonumber(redis.call("HGET", KEYS[2], "u:" .. host) or "0") >= hb
      if not over and global and tb >= 0 then
        over = tonumber(redis.call("HGET", global, "t:" .. topic) or "0") >= tb
      end
      if not over and global and cb >= 0 then
        over = tonumber(redis.call("HGET", global, "c") or "0") >= cb
      end
      if not over then
        redis.call("HINCRBY", KEYS[2], "u:" .. host, 1)
        local t, c = "", "0"
        if global then
          redis.call("HINCRBY", global, "t:" .. topic, 1)
          redis.call("HINCRBY", global, "c", 1)
          t, c = topic, "1"
        end
        redis.call("HSET", KEYS[2], "b:" .. id, host .. "\t" .. t .. "\t" .. c)
        result = 1
      else
        -- Held: out of the leases and the queue, into the over list, visible.
        unlease(KEYS[1], KEYS[2], id)
        local level = redis.call("HGET", KEYS[2], "s:" .. id) or "0"
        local payload = redis.call("HGET", KEYS[3], id) or ""
        redis.call("RPUSH", KEYS[4], id .. "\t" .. level .. "\t" .. host .. "\t" .. payload)
        redis.call("HINCRBY", KEYS[2], "o:" .. host, 1)
        forget(KEYS[2], KEYS[3], id)
        result = 0
      end
    end
  end
  out[#out + 1] = result
end
return out
