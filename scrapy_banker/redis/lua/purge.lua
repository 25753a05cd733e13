-- Move named queued requests of one host to the dead letters (reason "purged").
-- KEYS: 1 levels, 2 meta, 3 over, 4 dead.  ARGV: 1 partition label, 2 host,
-- then pairs: level, the exact queued entry ("<id> <payload>").
-- The caller found the entries by decoding the payloads (a script cannot:
-- payloads may be compressed); one leased meanwhile is not in its list any
-- more and stays leased.  The host's entries held over a budget go too.
-- KEYS[5] (optional): the crawl-wide budget hash.
-- Returns how many were dead-lettered.
-- #include _budget
local n = 0
local function letter(id, payload)
  redis.call("RPUSH", KEYS[4], cjson.encode({
    id = id, partition = ARGV[1], payload = payload, reason = "purged", deliveries = 0,
  }))
  n = n + 1
end
for i = 3, #ARGV, 2 do
  local level, entry = ARGV[i], ARGV[i + 1]
  local list = KEYS[1] .. ":" .. level
  if redis.call("LREM", list, 1, entry) == 1 then
    redis.call("HINCRBY", KEYS[2], "n", -1)
    if redis.call("EXISTS", list) == 0 then redis.call("ZREM", KEYS[1], level) end
    local space = string.find(entry, " ", 1, true) or (#entry + 1)
    local id = string.sub(entry, 1, space - 1)
    refund(KEYS[2], id, KEYS[5])  -- charged, then given back unfetched: never fetched now
    letter(id, string.sub(entry, space + 1))
  end
end
local items = redis.call("LRANGE", KEYS[3], 0, -1)
if #items > 0 then
  local keep = {}
  for _, item in ipairs(items) do
    local id, level, host, payload = string.match(item, "^([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$")
    if id and host == ARGV[2] then
      letter(id, payload)
    else
      keep[#keep + 1] = item
    end
  end
  redis.call("HDEL", KEYS[2], "o:" .. ARGV[2])
  redis.call("DEL", KEYS[3])
  if #keep > 0 then redis.call("RPUSH", KEYS[3], unpack(keep)) end
end
return n
