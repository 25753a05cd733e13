-- The politeness states of a partition's hosts, for a node that took it over.
-- Sent right after that node's pop in the same pipeline: if the pop was not
-- refused (NOTOWNER, BUSY), every lease of an earlier owner was released, and
-- the states that owner wrote before releasing them are all here.
-- KEYS: 1 hosts (hash host -> state JSON).  Returns HGETALL's flat list.
return redis.call("HGETALL", KEYS[1])
