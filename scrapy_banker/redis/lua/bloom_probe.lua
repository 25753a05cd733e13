-- Ask a native (RedisBloom) filter whether it holds an item, or learn that
-- the server has no BF.* commands.  A script because redis-py's cluster
-- client cannot route a command it does not know; EVALSHA it can.
-- KEYS: 1 bloom.  ARGV: 1 item.
-- Returns 1 / 0 (native: held or not), or -1 when the server has no BF.*
-- (or the key is a Lua bit array, which BF.EXISTS refuses with WRONGTYPE).
local answer = redis.pcall("BF.EXISTS", KEYS[1], ARGV[1])
if type(answer) == "table" and answer.err then
  if string.find(string.lower(answer.err), "unknown") then
    return -1
  end
  if string.find(answer.err, "WRONGTYPE") then
    return -2
  end
  return redis.error_reply(answer.err)
end
return answer
