-- Work left in partitions, each partition read atomically: queued + leased.
-- KEYS: meta1, leases1, meta2, leases2, ...  (meta's "n" counts the requests in
-- the level lists).  One partition's pair on Redis Cluster (a script touches
-- one slot); any number on one server.
-- ARGV: 1 "sum": the total, returned at the first partition with work;
--         "each": queued1, leased1, queued2, leased2, ...
-- A pop moves a request from the queue to the leases, a nack or the reaper
-- back: counts of one partition sent separately could miss it between
-- them, here they cannot.
local each = ARGV[1] == "each"
local out, total = {}, 0
for i = 1, #KEYS, 2 do
  local q = tonumber(redis.call("HGET", KEYS[i], "n") or "0")
  local l = redis.call("ZCARD", KEYS[i + 1])
  if each then
    out[#out + 1] = q
    out[#out + 1] = l
  else
    total = total + q + l
    if total > 0 then return total end
  end
end
if each then return out end
return total
