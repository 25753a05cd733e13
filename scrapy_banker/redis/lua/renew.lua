-- Heartbeat: extend the leases the caller still holds (XX: never resurrect one).
-- KEYS: 1 leases.  ARGV: 1 ttl ms, 2.. ids.  Returns how many were renewed.
local t = redis.call("TIME")
local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local renewed = 0
for i = 2, #ARGV do
  if redis.call("ZSCORE", KEYS[1], ARGV[i]) then
    redis.call("ZADD", KEYS[1], "XX", expiry, ARGV[i])
    renewed = renewed + 1
  end
end
return renewed
