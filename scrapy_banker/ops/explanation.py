"""One URL in a fleet: where its request is, and why it waits (``scrapy banker explain``).

:func:`explain_url` classifies the request with the crawl's own code (topic
rules, queue key, BKDR hash, partition), then reads its partition: the seen
set (or Bloom filter), the queued, leased and dead-lettered copies of the
request, the owner's heartbeat and epoch, the hand-over fence, and the
owner's telemetry (its download slot for the host, the topics it serves,
its admission gate).  The one sentence saying why the request waits is
built only from what was just read, most decisive reason first, so it
names what an operator can check.  A page the crawl revisits
(:setting:`BANKER_RECRAWL`) has its state in the same partition, said in
words as ``explain --jobdir`` says it
(:func:`~scrapy_banker.ops.revisits_view.describe`).

Reads only, and only one partition's keys plus the fleet's heartbeats and
telemetry; it runs when an operator asks, never in a crawl.  Payloads are
looked at with the project's JSON codec
(:func:`~scrapy_banker.ops.payloads.describe_payload`), never unpickled.
The schema of :meth:`Explanation.to_json` (``"kind": "explain"``) carries
:data:`~scrapy_banker.ops.fleet_view.SCHEMA_VERSION`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.recrawl import UrlState
from scrapy_banker.ops.fleet_deadletters import parse_letter
from scrapy_banker.ops.fleet_view import (
    SCHEMA_VERSION,
    handover_waits,
    node_registry,
    read_telemetry,
    revisit_states,
    round_or_none,
    server_time_ms,
)
from scrapy_banker.ops.payloads import PayloadInfo, describe_payload
from scrapy_banker.ops.revisits_view import describe
from scrapy_banker.redis.frontier.enqueue import in_bloom
from scrapy_banker.redis.keys import DELIVERIES, LEASE_EPOCH, decode
from scrapy_banker.scheduler.serialize import RequestCodec

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis
    from redis.cluster import RedisCluster
    from scrapy import Request

    from scrapy_banker.core.telemetry import Sample
    from scrapy_banker.redis.keys import Keyspace
    from scrapy_banker.settings import BankerConfig

    Client = redis.Redis | RedisCluster

__all__ = ["Copy", "Explanation", "explain_url"]

#: Queued entries read per round trip when looking for one request's copies.
_PAGE = 1000


@dataclass(frozen=True)
class Copy:
    """One copy of a request found in its partition."""

    id: str
    #: ``queued``, ``leased``, ``over budget`` or ``dead``.
    state: str
    #: Queued: requests ahead of it in the partition's queue.
    ahead: int | None = None
    #: Leased: deliveries so far and seconds until the lease expires (< 0: expired).
    deliveries: int | None = None
    expires_in_s: float | None = None
    #: Dead: why.
    reason: str | None = None
    #: What its payload says (topic, callback...).
    payload: PayloadInfo | None = None
    #: Leased: the partition epoch it was leased under (its owner then).
    epoch: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "ahead": self.ahead,
            "deliveries": self.deliveries,
            "expires_in_s": round_or_none(self.expires_in_s),
            "reason": self.reason,
            "epoch": self.epoch,
            "topic": None if self.payload is None else self.payload.topic,
            "callback": None if self.payload is None else self.payload.callback,
        }


@dataclass(frozen=True)
class Explanation:
    """Where one URL is in the crawl, and why it waits if it does."""

    url: str
    fingerprint: str
    topic: str
    #: How the topic was found: from a stored copy's meta, or by the rules.
    topic_source: str
    slot: str
    queue_key: str
    key_hash: int
    hash_function: str
    #: Bucket of the single-node directory (a JOBDIR's), None without one.
    bucket: int | None
    partition: int
    owner: str | None
    owner_alive: bool
    owner_epoch: int
    seen: bool
    copies: tuple[Copy, ...]
    #: ``queued``, ``leased``, ``over budget``, ``dead``, ``done`` (seen, nothing left) or
    #: ``unknown``.
    state: str
    #: One sentence: why it waits (None when it does not wait).
    waiting: str | None
    notes: tuple[str, ...] = ()
    #: When the page is fetched again (``BANKER_RECRAWL``), in words; None: it is not,
    #: or its state does not read (a note says so).
    revisit: str | None = None
    #: Whether its partition keeps a revisit state for it, readable or not.
    revisit_kept: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "kind": "explain",
            "url": self.url,
            "fingerprint": self.fingerprint,
            "topic": self.topic,
            "topic_source": self.topic_source,
            "slot": self.slot,
            "queue_key": self.queue_key,
            "key_hash": self.key_hash,
            "hash_function": self.hash_function,
            "bucket": self.bucket,
            "partition": self.partition,
            "owner": self.owner,
            "owner_alive": self.owner_alive,
            "owner_epoch": self.owner_epoch,
            "seen": self.seen,
            "state": self.state,
            "copies": [c.to_json() for c in self.copies],
            "waiting": self.waiting,
            "notes": list(self.notes),
            "revisit": self.revisit,
        }


def _find_copies(
    client: Client, keyspace: Keyspace, partition: int, url: str, now_ms: int,
    codec: RequestCodec,
) -> list[Copy]:  # fmt: skip
    """Every queued, leased and dead copy of the request in its partition.

    Ids are sequence numbers (``enqueue.lua``), so a copy is found by the URL
    its payload names: the partition's level lists are read 1,000 entries
    per round trip, in the order they will be popped (that order is the
    ``ahead`` count).  A partition holds its share of the crawl (1/1,024 of
    it by default) and this runs when an operator asks, never in a crawl.
    """
    k = keyspace.partition(partition)
    found: list[Copy] = []
    ahead = 0
    queued: list[tuple[str, PayloadInfo, int]] = []
    for level in client.zrange(k.levels, 0, -1):
        key = k.level(decode(level))
        start = 0
        while True:
            page = client.lrange(key, start, start + _PAGE - 1)
            for j, item in enumerate(page):
                copy_id, _, text = decode(item, lossy=True).partition(" ")
                if url in text or text[:1] == "Z":  # cheap filter before decoding
                    info = describe_payload(text, codec)
                    if info.url == url:
                        queued.append((copy_id, info, ahead + start + j))
            start += len(page)
            if len(page) < _PAGE:
                break
        ahead += start
    held: Any = client.zrange(k.leases, 0, -1, withscores=True)
    leases = [(decode(m), float(score)) for m, score in held]
    pipe = client.pipeline(transaction=False)
    for i, _ in leases:
        pipe.hget(k.payloads, i)
    leased: list[tuple[str, PayloadInfo, float]] = []
    for (i, score), raw in zip(leases, pipe.execute(), strict=True):
        info = describe_payload(None if raw is None else decode(raw, lossy=True), codec)
        if info.url == url:
            leased.append((i, info, score))
    ids = [i for i, _, _ in queued] + [i for i, _, _ in leased]
    if ids:
        pipe = client.pipeline(transaction=False)
        for i in ids:
            pipe.hget(k.meta, DELIVERIES.of(i))
        for i, _, _ in leased:
            pipe.hget(k.meta, LEASE_EPOCH.of(i))
        answers = pipe.execute()
        counts = answers[: len(ids)]
        deliveries = {
            i: 0 if d is None else int(decode(d)) for i, d in zip(ids, counts, strict=True)
        }
        epochs = answers[len(ids) :]
        for i, info, position in queued:
            found.append(Copy(i, "queued", ahead=position, deliveries=deliveries[i],
                              payload=info))  # fmt: skip
        for (i, info, score), epoch in zip(leased, epochs, strict=True):
            found.append(Copy(i, "leased", deliveries=deliveries[i],
                              expires_in_s=(score - now_ms) / 1000, payload=info,
                              epoch=None if epoch is None else int(decode(epoch))))  # fmt: skip
    for raw in client.lrange(k.over, 0, -1):
        # "<id>\t<priority>\t<host>\t<payload>" (lua/charge.lua)
        fields = decode(raw, lossy=True).split("\t", 3)
        if len(fields) == 4 and (url in fields[3] or fields[3][:1] == "Z"):
            info = describe_payload(fields[3], codec)
            if info.url == url:
                found.append(Copy(fields[0], "over budget", payload=info))
    for index, raw in enumerate(client.lrange(k.dead, 0, -1)):
        letter = parse_letter(partition, index, raw, codec)
        if letter.id is not None and letter.payload.url == url:
            found.append(Copy(letter.id, "dead", deliveries=letter.deliveries,
                              reason=letter.reason, payload=letter.payload))  # fmt: skip
    return found


def _slot_full(sample: Sample | None, slot: str) -> str | None:
    if sample is None:
        return None
    for s in sample.slots:
        if s.slot == slot and s.inflight >= s.limit:
            return (
                f"{sample.node}'s download slot for {slot} is full "
                f"({s.inflight}/{s.limit} in flight, {s.queued} more waiting there)"
            )
    return None


def _preempted(sample: Sample | None, topic: str, priority: Callable[[str], int]) -> str | None:
    if sample is None:
        return None
    mine = priority(topic)
    busy = [
        (priority(name), name, t.queued + t.inflight)
        for name, t in sample.topics.items()
        if name != topic and priority(name) > mine and t.queued + t.inflight > 0
    ]
    if not busy:
        return None
    prio, name, n = max(busy)
    return (
        f"topic {topic} (priority {mine}) is preempted on {sample.node} by topic {name} "
        f"(priority {prio}, {n} requests queued or in flight there)"
    )


def _parked(sample: Sample | None) -> str | None:
    if sample is None or sample.banker is None or not sample.banker.parked:
        return None
    b = sample.banker
    short = {r: n for r, n in b.available.items() if b.need.get(r, 0) > n}
    what = ", ".join(f"{r}: {n} available, {b.need[r]} still claimed" for r, n in short.items())
    return (
        f"{sample.node}'s admission gate parks {b.parked} requests whose grant would leave "
        f"an unsafe state" + (f" ({what})" if what else "")
    )


def _why_waiting(
    copy: Copy,
    *,
    partition: int,
    owner: str | None,
    owner_alive: bool,
    owner_age_s: float | None,
    node_timeout_s: float,
    busy: int,
    sample: Sample | None,
    slot: str,
    topic: str,
    priority: Callable[[str], int],
    leased_in_partition: int,
    owner_epoch: int,
    holder: str | None,
) -> str | None:
    """One sentence from the state just read, most decisive reason first."""
    if copy.state == "over budget":
        return (
            f"it is over budget: its host ({slot}), its topic ({topic}) or the crawl has "
            "been fetched as many pages as its budget allows; it is kept, and fetched if "
            "the budget is raised (scrapy banker budget)"
        )
    if copy.state == "dead":
        return (
            f"it is dead-lettered ({copy.reason}); nothing fetches it until it is requeued "
            "(scrapy banker deadletters --requeue)"
        )
    if copy.state == "leased":
        left = copy.expires_in_s or 0.0
        if left < 0:
            return (
                f"its lease expired {-left:.1f} s ago (delivery {copy.deliveries}): the "
                "reaper's next round gives it back to the queue or dead-letters it"
            )
        if copy.epoch is not None and copy.epoch != owner_epoch:
            return (
                f"it was leased at epoch {copy.epoch}, before partition {partition} moved to "
                f"{owner} (epoch {owner_epoch}): {holder or 'the previous owner'} is fetching "
                f"it, and {owner} pops nothing from the partition until it is acked or the "
                f"lease expires (in {left:.1f} s unless renewed)"
            )
        return (
            f"it is leased to {owner} (delivery {copy.deliveries}), being fetched or "
            f"buffered there; the lease expires in {left:.1f} s unless renewed"
        )
    if owner is None:
        return f"partition {partition} has no owner: no live worker has taken it (none running?)"
    if not owner_alive:
        age = "never" if owner_age_s is None else f"{owner_age_s:.1f} s ago"
        return (
            f"its owner {owner} is not live (last heartbeat {age}, timeout "
            f"{node_timeout_s:g} s): the partition waits for a live worker to rebalance it"
        )
    if busy:
        return (
            f"partition {partition} is in hand-over to {owner}, which pops nothing until the "
            f"previous owner's {busy} leases are acked or expire (BUSY fence)"
        )
    for reason in (_slot_full(sample, slot), _preempted(sample, topic, priority), _parked(sample)):
        if reason is not None:
            return reason
    ahead = copy.ahead or 0
    tail = "" if sample is not None else f" ({owner} publishes no telemetry)"
    if ahead:
        return (
            f"{ahead} requests are ahead of it in partition {partition}, which {owner} works "
            f"through ({leased_in_partition} leased now){tail}"
        )
    return f"it is next in partition {partition}: {owner} pops it on its next refill{tail}"


def explain_url(
    client: Client,
    keyspace: Keyspace,
    request: Request,
    *,
    fingerprint: str,
    config: BankerConfig,
    node_timeout_s: float = 30.0,
    bucket: int | None = None,
    codec: RequestCodec | None = None,
) -> Explanation:
    """Classify ``request`` like the crawl does and find it in Redis.

    ``fingerprint`` is the hex fingerprint of Scrapy's request fingerprinter
    (the one the crawl's enqueue script deduplicates on); ``bucket`` the
    single-node directory bucket, when the caller has a directory to ask.
    """
    # Imported here: the classifier pulls in Scrapy's downloader, which the
    # dashboard's read path does not need.
    from scrapy_banker.scheduler.classifier import Classifier
    from scrapy_banker.scheduler.downloader import DownloaderView

    codec = codec or RequestCodec()
    classifier = Classifier(config, DownloaderView(), None)
    had_topic = "banker_topic" in request.meta
    c = classifier.classify(request)
    partition = c.key_hash % keyspace.partitions
    registry = node_registry(client, keyspace, node_timeout_s)
    table = registry.load_table()
    owner = table.owners[partition]
    now_ms = server_time_ms(client)
    k = keyspace.partition(partition)
    pipe = client.pipeline(transaction=False)
    pipe.sismember(k.seen, fingerprint)
    pipe.zcard(k.leases)
    if owner is not None:
        pipe.zscore(keyspace.heartbeats, owner)
        pipe.hexists(keyspace.nodes, owner)
    answers = pipe.execute()
    # Seen by the exact set, or by the Bloom filter (BANKER_DEDUP = "bloom"):
    # whichever the crawl wrote, as its enqueue script checks both.
    seen = bool(answers[0]) or in_bloom(client, keyspace, partition, fingerprint)
    leased_now = int(answers[1])
    owner_age_s: float | None = None
    owner_alive = False
    if owner is not None:
        beat, registered = answers[2], answers[3]
        if beat is not None:
            owner_age_s = max(0.0, (now_ms - float(beat)) / 1000)
            owner_alive = bool(registered) and owner_age_s <= node_timeout_s
    copies = _find_copies(client, keyspace, partition, request.url, now_ms, codec)
    notes: list[str] = []
    topic, topic_source = c.topic, "rules"
    stored = [cp.payload.topic for cp in copies if cp.payload and cp.payload.topic]
    if stored:
        topic, topic_source = stored[0], "stored request"
    elif not had_topic and any(rule.callback is not None for rule in config.topic_rules):
        notes.append(
            "topic from the URL rules only: the request's callback is unknown here, so "
            "callback rules were tried against Scrapy's default 'parse'"
        )
    busy = handover_waits(client, keyspace, table, [
        leased_now if p == partition else 0 for p in range(keyspace.partitions)
    ]).get(partition, 0)  # fmt: skip
    beats: Any = client.zrange(keyspace.heartbeats, 0, -1)
    samples = read_telemetry(
        client, keyspace, sorted({decode(n) for n in beats} | {owner or ""} - {""})
    )
    sample = samples.get(owner) if owner is not None else None
    # Who holds a lease taken before a hand-over: the node whose telemetry
    # shows a request in flight in the URL's slot (None if nobody says so).
    holder = next(
        (n for n, sm in sorted(samples.items())
         if n != owner and any(s.slot == c.slot and s.inflight for s in sm.slots)),
        None,
    )  # fmt: skip
    state = "unknown"
    waiting: str | None = None
    for wanted in ("leased", "queued", "over budget", "dead"):
        match = next((cp for cp in copies if cp.state == wanted), None)
        if match is not None:
            state = wanted
            waiting = _why_waiting(
                match,
                partition=partition,
                owner=owner,
                owner_alive=owner_alive,
                owner_age_s=owner_age_s,
                node_timeout_s=node_timeout_s,
                busy=busy,
                sample=sample,
                slot=c.slot,
                topic=topic,
                priority=config.topic_priority,
                leased_in_partition=leased_now,
                owner_epoch=table.epochs[partition],
                holder=holder,
            )
            break
    if state == "unknown" and seen:
        state = "done"
    if len(copies) > 1:
        notes.append(f"{len(copies)} copies found (dont_filter requests or redeliveries)")
    # A page the crawl revisits (a start URL too: Scrapy asks for those with
    # dont_filter, so the seen set never has them), kept where its requests go.
    kept = revisit_states(client, keyspace).read(partition, request.url)
    revisit = None
    if kept is not None:
        try:
            revisit = describe(UrlState.from_text(kept[0]), now_ms / 1000)
        except ValueError as exc:
            notes.append(
                f"its revisit state in partition {partition} does not read ({exc}): the "
                "partition's owner moves it to the dead letters when it comes due"
            )
    return Explanation(
        url=request.url,
        fingerprint=fingerprint,
        topic=topic,
        topic_source=topic_source,
        slot=c.slot,
        queue_key=c.key,
        key_hash=c.key_hash,
        hash_function=config.queue_hash,
        bucket=bucket,
        partition=partition,
        owner=owner,
        owner_alive=owner_alive,
        owner_epoch=table.epochs[partition],
        seen=seen,
        copies=tuple(copies),
        state=state,
        waiting=waiting,
        notes=tuple(notes),
        revisit=revisit,
        revisit_kept=kept is not None,
    )
