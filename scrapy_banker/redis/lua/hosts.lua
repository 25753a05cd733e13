-- Write the politeness states of a partition's hosts (its owner's, in batches).
-- KEYS: 1 owner, 2 hosts (hash host -> state JSON), 3 meta
-- ARGV: 1 node, 2 epoch, then host, state pairs ("" deletes the host's field)
-- Written by the partition's owner at that epoch, or by a previous owner
-- while leases it took at its epoch are still out: the states its last
-- answers left reach Redis before the acks that release those leases (one
-- ordered batch), and the new owner's pops wait (BUSY) for those leases, so
-- it reads the states after them, before it dispatches anything.  Anyone
-- else -- a node stopped past its leases -- gets NOTOWNER and writes nothing.
-- Returns how many fields were set or deleted.
local owner = redis.call("GET", KEYS[1])
if owner ~= ARGV[1] .. "@" .. ARGV[2] then
  local out = tonumber(redis.call("HGET", KEYS[3], "h:" .. ARGV[2]) or "0")
  if out <= 0 then
    return redis.error_reply("NOTOWNER " .. tostring(owner))
  end
end
local n = 0
for i = 3, #ARGV - 1, 2 do
  if ARGV[i + 1] == "" then
    n = n + redis.call("HDEL", KEYS[2], ARGV[i])
  else
    redis.call("HSET", KEYS[2], ARGV[i], ARGV[i + 1])
    n = n + 1
  end
end
return n
