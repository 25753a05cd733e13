-- Keep a page's revisit state (BANKER_RECRAWL on a fleet) in its partition.
-- KEYS: 1 revisits (hash url -> state JSON), 2 revisit requests (hash url -> payload),
--       3 revisit due (zset url -> due, POSIX seconds)
-- ARGV: 1 url, 2 state JSON, 3 due, 4 payload ("" keeps the stored one)
-- A state older than the one kept (its last fetch earlier: a spill replayed
-- late, a slow worker) changes nothing.  Returns 1 if written, else 0.
local kept = redis.call("HGET", KEYS[1], ARGV[1])
if kept then
  local ok_old, old = pcall(cjson.decode, kept)
  local ok_new, new = pcall(cjson.decode, ARGV[2])
  if ok_old and ok_new and type(old) == "table" and type(new) == "table" then
    local before = tonumber(old.fetched) or 0
    local after = tonumber(new.fetched) or 0
    if after < before then
      return 0
    end
  end
end
redis.call("HSET", KEYS[1], ARGV[1], ARGV[2])
redis.call("ZADD", KEYS[3], ARGV[3], ARGV[1])
if ARGV[4] ~= "" then
  redis.call("HSET", KEYS[2], ARGV[1], ARGV[4])
end
return 1
