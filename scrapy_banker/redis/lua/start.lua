-- Mark leased requests whose fetch began: only such deliveries count towards
-- the dead letters when leases expire.  A request a worker only held in its
-- buffer when it died (or froze) goes back with nothing against it, or a run
-- of faults would dead-letter it unfetched (the chaos soak lost pages so).
-- Meta: c:<id> counts the fetches begun, f:<id> the delivery last marked
-- (marking the same delivery twice counts once).
-- KEYS: 1 meta.  ARGV: id#delivery tokens.  Returns how many were marked.
local n = 0
for i = 1, #ARGV do
  local id, token = string.match(ARGV[i], "^(.*)#(%d+)$")
  if id and redis.call("HGET", KEYS[1], "d:" .. id) == token
      and redis.call("HGET", KEYS[1], "f:" .. id) ~= token then
    redis.call("HSET", KEYS[1], "f:" .. id, token)
    redis.call("HINCRBY", KEYS[1], "c:" .. id, 1)
    n = n + 1
  end
end
return n
