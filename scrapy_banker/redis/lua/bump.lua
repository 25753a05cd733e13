-- Bump the crawl's "finished" version (INCR) before a batch that finishes
-- requests (acks, dead letters, a reaper round), in the same ordered batch.
-- KEYS: 1 the version key.  Returns the new version.
return redis.call("INCR", KEYS[1])
