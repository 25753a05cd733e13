-- Compare-and-set the control document (one key: works on a cluster too).
-- KEYS: 1 control.  ARGV: 1 the document as read ("" if none), 2 the new document.
-- Returns 1 if set, 0 if another action changed it since it was read.
local now = redis.call("GET", KEYS[1]) or ""
if now ~= ARGV[1] then return 0 end
redis.call("SET", KEYS[1], ARGV[2])
return 1
