-- Requeue one dead letter, on purpose (scrapy banker deadletters --requeue).
-- KEYS: 1 dead (list), 2 queue, 3 seen, 4 payloads, 5 meta.
-- ARGV: 1 the letter exactly as stored, 2 priority.
-- Removes that one letter and queues its payload under a fresh id in one
-- step: the letter is either still in the list or queued, never lost, never
-- queued twice (a second requeue of the same letter finds it gone).  The
-- fingerprint is (re)added to the seen set, so dedup keeps knowing it.
-- Returns the new id, or false if the letter is gone or carries no payload.
local raw = ARGV[1]
local ok, letter = pcall(cjson.decode, raw)
if not ok or type(letter) ~= "table" or type(letter.id) ~= "string"
    or type(letter.payload) ~= "string" then
  return false
end
local fp = string.match(letter.id, "^(.*):%d+$")
if not fp then return false end
if redis.call("LREM", KEYS[1], 1, raw) == 0 then
  return false
end
redis.call("SADD", KEYS[3], fp)
local seq = redis.call("HINCRBY", KEYS[5], "seq", 1)
local id = fp .. ":" .. seq
local score = -tonumber(ARGV[2]) * 4294967296 + seq
redis.call("ZADD", KEYS[2], score, id)
redis.call("HSET", KEYS[4], id, letter.payload)
return id
