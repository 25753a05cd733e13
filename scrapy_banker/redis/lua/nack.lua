-- Give leased requests back unprocessed (a clean stop, a lost partition): they
-- go back to the head of their priority's list and the delivery does not count.
-- KEYS: 1 levels, 2 leases, 3 meta, 4 payloads, [5 the crawl-wide budget hash: unused].
-- ARGV: ids, or id#delivery tokens.
-- Returns how many were leased.
-- #include _lease
-- #include _putback
local n = 0
-- Last first: each goes to the head, so the first given back ends up first.
for i = #ARGV, 1, -1 do
  local id, token = string.match(ARGV[i], "^(.*)#(%d+)$")
  if not id then id = ARGV[i] end
  -- "id#n" acts only on delivery n: a holder whose lease expired and was
  -- handed to another node must not ack or requeue that node's delivery.
  if token and redis.call("HGET", KEYS[3], "d:" .. id) ~= token then id = nil end
  if id and unlease(KEYS[2], KEYS[3], id) then
    n = n + 1
    -- Given back unprocessed: neither the delivery nor a fetch it began counts.
    local d = redis.call("HINCRBY", KEYS[3], "d:" .. id, -1)
    if redis.call("HGET", KEYS[3], "f:" .. id) == tostring(d + 1) then
      redis.call("HINCRBY", KEYS[3], "c:" .. id, -1)
    end
    redis.call("HDEL", KEYS[3], "f:" .. id)
    -- A budget page it was charged stays with it (its "b:" record): whoever
    -- leases it next fetches it without a new charge.
    put_back(KEYS[1], KEYS[4], KEYS[3], id)
  end
end
return n
