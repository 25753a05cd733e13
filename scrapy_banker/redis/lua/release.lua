-- Put the requests held over a budget back in the queue (a budget was raised
-- or removed): each goes to the head of its priority's list and is charged
-- again when leased -- held again if its budget is still spent.
-- KEYS: 1 levels, 2 meta, 3 over.  ARGV: 1 host ("" = every host).
-- Returns how many went back.
local items = redis.call("LRANGE", KEYS[3], 0, -1)
if #items == 0 then return 0 end
local keep, n = {}, 0
for i = #items, 1, -1 do
  local item = items[i]
  local id, level, host, payload = string.match(item, "^([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$")
  if id and (ARGV[1] == "" or ARGV[1] == host) then
    local list = KEYS[1] .. ":" .. level
    if redis.call("LPUSH", list, id .. " " .. payload) == 1 then
      redis.call("ZADD", KEYS[1], -tonumber(level), level)
    end
    redis.call("HINCRBY", KEYS[2], "n", 1)
    if redis.call("HINCRBY", KEYS[2], "o:" .. host, -1) <= 0 then redis.call("HDEL", KEYS[2], "o:" .. host) end
    n = n + 1
  else
    table.insert(keep, 1, item)
  end
end
redis.call("DEL", KEYS[3])
if #keep > 0 then redis.call("RPUSH", KEYS[3], unpack(keep)) end
return n
