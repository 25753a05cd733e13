-- Requeue one dead letter, on purpose (scrapy banker deadletters --requeue).
-- KEYS: 1 dead (list), 2 levels, 3 meta.
-- ARGV: 1 the letter exactly as stored, 2 priority (an integer, as text).
-- Removes that one letter and queues its payload under a fresh id in one
-- step: the letter is either still in the list or queued, never lost, never
-- queued twice (a second requeue of the same letter finds it gone).  Its
-- fingerprint stayed in the seen set (or Bloom filter) since it was first
-- queued, so dedup keeps knowing it.
-- Returns the new id, or false if the letter is gone or carries no payload.
local raw = ARGV[1]
local ok, letter = pcall(cjson.decode, raw)
if not ok or type(letter) ~= "table" or type(letter.id) ~= "string"
    or type(letter.payload) ~= "string" then
  return false
end
if redis.call("LREM", KEYS[1], 1, raw) == 0 then
  return false
end
local seq = redis.call("HINCRBY", KEYS[3], "seq", 1)
if redis.call("RPUSH", KEYS[2] .. ":" .. ARGV[2], seq .. " " .. letter.payload) == 1 then
  redis.call("ZADD", KEYS[2], -tonumber(ARGV[2]), ARGV[2])
end
redis.call("HINCRBY", KEYS[3], "n", 1)
return tostring(seq)
