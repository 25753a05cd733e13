"""Every Redis key of one crawl, named in one place.

A crawl lives under a prefix (``BANKER_REDIS_PREFIX``).  Keys of partition
``p`` share the hash tag ``{<prefix>:<p>}``: Redis Cluster hashes only the
tagged part, so all of a partition's keys land in one slot and each Lua
script -- which may only touch keys of one slot on a cluster -- works there.
Fleet and placement keys are plain ``<prefix>:<name>`` strings, read and
written by ordinary commands, never inside a script.

Owning the names here, like RQ's classes own their key templates, keeps
:meth:`Keyspace.cleared` (what ``BANKER_REDIS_FLUSH_ON_START`` deletes) in
step with the keys the frontier, the registry and the placement agent
actually write: no module keeps its own list of another module's keys, so
none can be left out of a flush.

The fields of the hashes the Lua scripts keep -- a partition's meta
(:attr:`PartitionKeys.meta`) and the crawl-wide budget
(:attr:`Keyspace.budget`) -- are declared here too, once each
(:data:`META_FIELDS`, :data:`BUDGET_FIELDS`): the name or prefix, the
value's type, the scripts that change it and what it means.  Python code
names a field through its declaration (``DELIVERIES.of(id)``,
``QUEUED.name``), never by a string of its own, and
``tests/test_redis_keys.py`` reads every script's hash commands and holds
them to these declarations, both ways.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "BLOOM_CAPACITY",
    "BLOOM_FILLED",
    "BLOOM_GEOMETRY",
    "BLOOM_LAYERS",
    "BUDGET_FIELDS",
    "CHARGE",
    "CRAWL_DONE",
    "CRAWL_PAGES",
    "DELIVERIES",
    "EPOCH_LEASES",
    "FETCHES",
    "FETCH_MARK",
    "HOST_HELD",
    "HOST_PAGES",
    "LEASE_EPOCH",
    "LEVEL",
    "META_FIELDS",
    "QUEUED",
    "SEQ",
    "TOPIC_PAGES",
    "HashField",
    "Keyspace",
    "PartitionKeys",
    "decode",
]


@dataclass(frozen=True, slots=True)
class HashField:
    """One field of a hash the Lua scripts keep, or a family of fields sharing a prefix.

    A family's fields are the prefix followed by what :attr:`key` names
    (``d:`` and ``<id>``: ``d:17``, the deliveries of request 17).
    """

    #: The field's name, or the family's prefix (``"d:"``).
    name: str
    #: What follows the prefix in a family's fields (``"<id>"``); ``""``: a single field.
    key: str
    #: The type of the value: ``int`` (a count or a number, as ``HINCRBY``
    #: keeps it) or ``str``.
    kind: type[int] | type[str]
    #: The scripts (``lua/<name>.lua``, with the shared pieces they call)
    #: that set, count or delete it.
    writers: tuple[str, ...]
    #: What it holds, for whom.
    meaning: str

    @property
    def pattern(self) -> str:
        """How the docs write it: ``n``, ``d:<id>``."""
        return self.name + self.key

    def of(self, key: object) -> str:
        """The family's field for ``key``: ``DELIVERIES.of(17) == "d:17"``."""
        if not self.key:
            raise ValueError(f"{self.name!r} is a single field, not a family")
        return f"{self.name}{key}"

    def key_of(self, field: str) -> str | None:
        """What follows the family's prefix in ``field``; None for another field."""
        if self.key and field.startswith(self.name):
            return field[len(self.name) :]
        return None


# -- a partition's meta hash (PartitionKeys.meta) -------------------------------------
# The scripts that call a shared piece change what it changes.
_UNLEASE = ("ack", "charge", "deadletter", "nack", "reap")  # _lease.lua's unlease
_FORGET = ("ack", "charge", "deadletter", "reap")  # _lease.lua's forget
_REFUND = ("ack", "deadletter", "purge", "reap")  # _budget.lua's refund

SEQ = HashField(
    "seq", "", int, writers=("enqueue", "requeue"),
    meaning="The partition's sequence counter: the last id given to a queued request.",
)  # fmt: skip
QUEUED = HashField(
    "n", "", int, writers=("enqueue", "nack", "pop", "purge", "reap", "release", "requeue"),
    meaning="Requests waiting in the level lists: what the drain check, count.lua and "
    "the operators' views count as queued (the leased ones are the leases' size); "
    "pop.lua returns it to the owner, whose pops and pacing serve the longest first.",
)  # fmt: skip
DELIVERIES = HashField(
    "d:", "<id>", int, writers=("nack", "pop", *_FORGET),
    meaning="How often the request was leased (a nack takes its delivery back): "
    "the delivery an ``id#delivery`` token must name to ack, nack, start or charge it.",
)  # fmt: skip
FETCHES = HashField(
    "c:", "<id>", int, writers=("nack", "start", *_FORGET),
    meaning="Deliveries of the request whose fetch began (start.lua): the reaper "
    "dead-letters it at max_deliveries of them.",
)  # fmt: skip
FETCH_MARK = HashField(
    "f:", "<id>", int, writers=("nack", "start", *_FORGET),
    meaning="The delivery start.lua marked last: marked twice, it counts once; a nack "
    "of it takes its fetch back.",
)  # fmt: skip
LEVEL = HashField(
    "s:", "<id>", int, writers=("nack", "pop", *_FORGET),
    meaning="The priority a leased request goes back to (a nack, the reaper); a "
    "queued request has none.",
)  # fmt: skip
LEASE_EPOCH = HashField(
    "e:", "<id>", int, writers=("pop", *_UNLEASE),
    meaning="The partition's epoch the request was leased at, while it is leased.",
)  # fmt: skip
EPOCH_LEASES = HashField(
    "h:", "<epoch>", int, writers=("pop", *_UNLEASE),
    meaning="Leases out that were taken at the epoch, deleted at zero: pop.lua "
    "answers BUSY while leases of another epoch are out, and hosts.lua lets a "
    "previous owner write while leases of its epoch are.",
)  # fmt: skip
CHARGE = HashField(
    "b:", "<id>", str, writers=("charge", *_REFUND),
    meaning="What the request's page was charged to, ``host TAB topic TAB 0|1`` "
    "(1: the crawl budget too): kept through nacks and reaps, given back by a "
    "dead letter, a purge or an ack that queued a copy (_budget.lua).",
)  # fmt: skip
HOST_PAGES = HashField(
    "u:", "<host>", int, writers=("charge", *_REFUND),
    meaning="Pages charged to the host (fetched, or leased to be): its budget's "
    "count, deleted at zero.",
)  # fmt: skip
HOST_HELD = HashField(
    "o:", "<host>", int, writers=("charge", "purge", "release"),
    meaning="The host's requests held over a budget, in the partition's over list.",
)  # fmt: skip
BLOOM_GEOMETRY = HashField(
    "bf", "", str, writers=("enqueue",),
    meaning="``<bits>:<hashes>`` of a Bloom bit array's first layer, fixed when the "
    "filter is created.  The ``bf`` fields are in the partition's meta on Redis "
    "Cluster, in the shard's hash (:meth:`Keyspace.bloom_shard_meta`) on one server.",
)  # fmt: skip
BLOOM_CAPACITY = HashField(
    "bfc", "", int, writers=("enqueue",),
    meaning="Items the bit array's first layer holds (layer j holds 2^j times as many).",
)  # fmt: skip
BLOOM_LAYERS = HashField(
    "bfl", "", int, writers=("enqueue",),
    meaning="Layers of the bit array (1 when absent).",
)  # fmt: skip
BLOOM_FILLED = HashField(
    "bfn", "", int, writers=("enqueue",),
    meaning="Items added to the bit array's last layer (0 when absent).",
)  # fmt: skip

#: Every field of a partition's meta hash (:attr:`PartitionKeys.meta`); a
#: Bloom shard's hash (:meth:`Keyspace.bloom_shard_meta`) has the ``bf`` ones.
META_FIELDS: tuple[HashField, ...] = (
    SEQ, QUEUED, DELIVERIES, FETCHES, FETCH_MARK, LEVEL, LEASE_EPOCH, EPOCH_LEASES,
    CHARGE, HOST_PAGES, HOST_HELD, BLOOM_GEOMETRY, BLOOM_CAPACITY, BLOOM_LAYERS, BLOOM_FILLED,
)  # fmt: skip

# -- the crawl-wide budget hash (Keyspace.budget, one server only) ---------------------
CRAWL_PAGES = HashField(
    "c", "", int, writers=("charge", *_REFUND),
    meaning="Pages charged crawl-wide: the crawl budget's count.",
)  # fmt: skip
CRAWL_DONE = HashField(
    "d", "", int, writers=("ack",),
    meaning="Pages charged to the crawl budget that were fetched and acked: the "
    "crawl ends when they reach its budget.",
)  # fmt: skip
TOPIC_PAGES = HashField(
    "t:", "<topic>", int, writers=("charge", *_REFUND),
    meaning="Pages charged to the topic: its budget's count.",
)  # fmt: skip

#: Every field of the crawl-wide budget hash (:attr:`Keyspace.budget`).
BUDGET_FIELDS: tuple[HashField, ...] = (CRAWL_PAGES, CRAWL_DONE, TOPIC_PAGES)


@dataclass(frozen=True)
class PartitionKeys:
    """One partition's keys; they share one hash tag, hence one cluster slot."""

    #: Sorted set of the priorities that have requests queued, scored
    #: ``-priority`` (highest first).  The requests themselves wait in one
    #: list per priority, :meth:`level`: ``"<id> <payload>"`` entries, packed
    #: by Redis a few bytes apart, where a sorted set entry plus a hash entry
    #: per request cost ~200 bytes more (issue #17).
    levels: str
    #: Sorted set of leased ids, scored by expiry on the server's clock.
    leases: str
    #: Hash id -> payload of the requests leased now (queued ones live in
    #: their level's list).
    payloads: str
    #: Hash of the partition's counters and of per-request and per-host
    #: fields, every one declared in :data:`META_FIELDS`.
    meta: str
    #: ``node@epoch`` of the owner: what the pop script fences on.
    owner: str
    #: List of dead letters (JSON with the reason).
    dead: str
    #: Set of fingerprints already queued (``BANKER_DEDUP = "set"``).
    seen: str
    #: Bloom filter of fingerprints already queued (``BANKER_DEDUP = "bloom"``):
    #: a RedisBloom filter where the server has ``BF.*``, else a bit array
    #: in a plain string whose geometry is the ``bf`` field of :attr:`meta`.
    bloom: str
    #: Hash host -> its politeness state as JSON
    #: (:class:`~scrapy_banker.core.politeness.HostState`: a Retry-After
    #: block, the backoff, Crawl-delay, throttle delay, last request sent),
    #: written by the partition's owner (``lua/hosts.lua``, fenced like a
    #: pop) and read by a new owner before it dispatches the partition's
    #: requests.  A host back to the default state has no field.
    hosts: str
    #: List of the requests held over a budget (``lua/charge.lua``):
    #: ``"<id>\t<priority>\t<host>\t<payload>"``, back in the queue when a
    #: budget is raised (``lua/release.lua``).  Budget counts live in
    #: :attr:`meta`: :data:`HOST_PAGES`, :data:`HOST_HELD`, :data:`CHARGE`.
    over: str
    #: Hash URL -> its revisit state as JSON
    #: (:class:`~scrapy_banker.core.recrawl.UrlState`, ``BANKER_RECRAWL``):
    #: written after each fetch of a page of the partition (``lua/revisit_save.lua``).
    revisits: str
    #: Hash URL -> the spider's request a revisit of the page copies (a payload).
    revisit_requests: str
    #: Sorted set URL -> when the page is next due (POSIX seconds): the due index
    #: ``lua/revisit_pop.lua`` takes due pages from, pushing each one's due time
    #: forward as it hands it out (a worker that dies before queueing the
    #: revisit leaves it to come due again).
    revisit_due: str

    def names(self) -> tuple[str, ...]:
        """The fixed keys; the level lists are named by what :attr:`levels` holds."""
        return astuple(self)

    def level(self, priority: int | str) -> str:
        """The list of the requests queued at ``priority``.

        The Lua scripts name it the same way (``levels .. ":" .. priority``)
        from the priorities :attr:`levels` holds: it shares the hash tag, so
        it is in the partition's slot.
        """
        return f"{self.levels}:{priority}"


class Keyspace:
    """The key names of one crawl: ``prefix`` and its partition count."""

    def __init__(self, prefix: str, partitions: int = 1024) -> None:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"partitions must be an integer >= 1, got {partitions!r}")
        # A brace in the prefix would end the hash tag early: partitions
        # would share slots unpredictably, or split one partition over two.
        if not prefix or any(c in prefix for c in "{}"):
            raise ValueError(f"prefix must be non-empty and free of braces, got {prefix!r}")
        self.prefix = prefix
        self.partitions = partitions
        # -- the fleet (NodeRegistry) --
        #: Hash node -> capacity.
        self.nodes = f"{prefix}:nodes"
        #: Sorted set node -> last beat, in the server's milliseconds.
        self.heartbeats = f"{prefix}:heartbeats"
        #: The partition table (owners and epochs) as JSON.
        self.table = f"{prefix}:table"
        #: Single-flight locks: one rebalance, one reaper at a time fleet-wide.
        self.rebalance_lock = f"{prefix}:rebalance-lock"
        self.reaper_lock = f"{prefix}:reaper-lock"
        #: Counter bumped (INCR) before every batch that finishes requests --
        #: acks, dead letters, a reaper round -- so that a drain check that
        #: reads it before and after counting every partition knows no work
        #: moved from a partition it had not counted yet to one it had.
        self.finished = f"{prefix}:finished"
        # -- placement (PlacementAgent) --
        #: Hash partition -> netloc of the site it holds (first one wins).
        self.sites = f"{prefix}:sites"
        #: Hash netloc -> scheme, for the prober.
        self.schemes = f"{prefix}:schemes"
        #: Hash node -> storage bandwidth BS (bytes/s).
        self.net_bs = f"{prefix}:net:bs"
        #: Hash partition -> its cost when a hungarian plan placed it.
        self.net_placed = f"{prefix}:net:placed"
        #: Hash netloc -> requests queued or leased for it at the last plan.
        self.net_backlog = f"{prefix}:net:backlog"
        #: Held for one interval by the node that planned: one plan per interval.
        self.plan_gate = f"{prefix}:net:plan-gate"
        # -- dedup (BANKER_DEDUP = "bloom" on one server) --
        #: How many shards the crawl-wide Bloom filter has (:meth:`bloom_shard`),
        #: fixed when the first worker wrote it.
        self.bloom_shards = f"{prefix}:bloom-shards"
        # -- run-time control and budgets (ControlChannel) --
        #: The operator's directives in force, as JSON
        #: (:class:`~scrapy_banker.core.directives.ControlState`).
        self.control = f"{prefix}:control"
        #: List of every operator action (JSON: who, when, what), newest first, capped.
        self.control_log = f"{prefix}:control:log"
        #: Set of the host names the crawl has queued requests of (what
        #: ``pause HOST`` and friends accept without ``--force``).
        self.known_hosts = f"{prefix}:known-hosts"
        #: Set of the topics the crawl has queued requests under.
        self.known_topics = f"{prefix}:known-topics"
        #: Hash of the pages charged crawl-wide (:data:`BUDGET_FIELDS`); a
        #: single server only (a host's count is in its partition).
        self.budget = f"{prefix}:budget"

    def __repr__(self) -> str:
        return f"Keyspace({self.prefix!r}, partitions={self.partitions})"

    def partition(self, partition: int) -> PartitionKeys:
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition must be in [0, {self.partitions}), got {partition!r}")
        tag = f"{{{self.prefix}:{partition}}}"
        return PartitionKeys(
            levels=f"{tag}:lv",
            leases=f"{tag}:leases",
            payloads=f"{tag}:payloads",
            meta=f"{tag}:meta",
            owner=f"{tag}:owner",
            dead=f"{tag}:dead",
            seen=f"{tag}:seen",
            bloom=f"{tag}:bloom",
            hosts=f"{tag}:hosts",
            over=f"{tag}:over",
            revisits=f"{tag}:revisits",
            revisit_requests=f"{tag}:revisit-requests",
            revisit_due=f"{tag}:revisit-due",
        )

    def bloom_shard(self, shard: int) -> str:
        """One shard of the crawl-wide Bloom filter (a fingerprint picks it by its hash).

        On one server a script may touch any key, so the filter is sized for
        the whole crawl and shared by every partition: per-partition filters
        must each be sized for a partition's share, and hosts are not equal
        (a Zipf crawl left most of them half empty and made others grow).
        On Redis Cluster each partition keeps its own (:attr:`PartitionKeys.bloom`):
        the check and the enqueue must share a slot.
        """
        return f"{self.prefix}:bloom:{shard}"

    def bloom_shard_meta(self, shard: int) -> str:
        """Hash with the geometry of :meth:`bloom_shard`'s bit array (as a partition's meta)."""
        return f"{self.prefix}:bloom:{shard}:meta"

    def ready(self, node: str) -> str:
        """Set of partitions of ``node`` that other workers just queued work in (expires).

        A wake-up, not a record: the owner pops those partitions next instead
        of scanning every partition it owns to find them.
        """
        return f"{self.prefix}:ready:{node}"

    def robots(self, origin: str) -> str:
        """The robots.txt of ``origin`` (``scheme://netloc``) one worker fetched (expires).

        ``"<status>\\n<body>"`` (``"error\\n<reason>"`` when the fetch
        failed), written with an expiry (:setting:`BANKER_ROBOTS_TTL`), so the
        fleet fetches each host's robots.txt once, not once per worker; see
        :mod:`scrapy_banker.scheduler.robots`.  Expiring, it needs no clearing.
        """
        return f"{self.prefix}:robots:{origin}"

    def robots_lock(self, origin: str) -> str:
        """Held (``SET NX PX``) by the one worker fetching ``origin``'s robots.txt."""
        return f"{self.prefix}:robots-lock:{origin}"

    def telemetry(self, node: str) -> str:
        """The node's latest :class:`~scrapy_banker.core.telemetry.Sample` as JSON (expires).

        Written by the node itself, read by ``scrapy banker status`` and the
        dashboard; it expires a few intervals after the node stops writing,
        so it needs no clearing.
        """
        return f"{self.prefix}:telemetry:{node}"

    def rtt(self, node: str) -> str:
        """Hash netloc -> the node's denoised round-trip time (ms)."""
        return f"{self.prefix}:net:rtt:{node}"

    def bw(self, node: str) -> str:
        """Hash netloc -> the node's measured bandwidth (bytes/s)."""
        return f"{self.prefix}:net:bw:{node}"

    def bs_probe(self, node: str) -> str:
        """Scratch key the node writes to measure its storage bandwidth (expires)."""
        return f"{self.prefix}:net:bs-probe:{node}"

    def cleared(self) -> Iterator[str]:
        """The keys a fresh start deletes: everything of the crawl but the network.

        Every partition's keys go, and with them whatever is tied to the old
        table: the fleet, the locks, the partition -> site map, the placed
        costs, the backlogs, the plan gate.  The fleet's network measurements
        (:meth:`rtt`, :meth:`bw`, :attr:`net_bs`) and the operators' log
        (:attr:`control_log`) are kept on purpose: links
        do not change between crawls, and a re-crawl that finds them places
        its sites at once, and the log is the record of who did what.
        Probe keys expire by themselves.  Named one by
        one, never found by ``KEYS``/``SCAN`` (which a cluster runs per node);
        each partition's level lists (:meth:`PartitionKeys.level`) are named
        by its :attr:`~PartitionKeys.levels` set and the Bloom shards by
        :attr:`bloom_shards`, which the caller reads first
        (:meth:`RedisFrontier.clear <scrapy_banker.redis.frontier.RedisFrontier.clear>`).
        """
        for p in range(self.partitions):
            yield from self.partition(p).names()
        yield self.nodes
        yield self.heartbeats
        yield self.table
        yield self.rebalance_lock
        yield self.reaper_lock
        yield self.sites
        yield self.schemes
        yield self.net_placed
        yield self.net_backlog
        yield self.plan_gate
        yield self.bloom_shards
        yield self.control
        yield self.known_hosts
        yield self.known_topics
        yield self.budget


def decode(value: object, lossy: bool = False) -> str:
    """A Redis reply as text; ``lossy`` for what a stranger may have written.

    Replies are bytes unless the client decodes them.  Data the crawl wrote
    itself (ids, node names) is UTF-8, and anything else is a bug worth an
    error; payloads, dead letters and fleet-published hashes may hold
    anyone's bytes, and must reach the code that rejects them rather than
    crash the worker thread on the way.
    """
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace" if lossy else "strict")
    return str(value)
