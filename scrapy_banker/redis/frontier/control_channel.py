"""Run-time control of a fleet through its keyspace: directives, the action log, budgets.

An operator's action (``scrapy banker pause HOST``, the dashboard's buttons)
changes one JSON document, :attr:`Keyspace.control
<scrapy_banker.redis.keys.Keyspace.control>`, by compare-and-set (a script:
two operators acting at once both land, one after the other, on a cluster
too), and appends a line to the action log.  Every worker reads the
document twice a heartbeat (:class:`~scrapy_banker.redis.worker.control_box.ControlJob`)
and applies it to the hosts it fetches; nothing is sent to a worker, so an
action reaches the nodes that join later and survives any rebalance: the
partition's new owner reads the same document.

Budgets are counted where the leases are (``lua/charge.lua``, in the
partition's slot): a host's pages in its partition's meta, a topic's and the
crawl's in :attr:`Keyspace.budget <scrapy_banker.redis.keys.Keyspace.budget>`,
which a partition's script can reach on a single server only; on Redis
Cluster a crawl may have host budgets, not topic or crawl budgets
(:func:`check_cluster`).  This class reads those counts for ``status``,
``explain`` and the metrics, and puts held requests back (``lua/release.lua``)
or dead-letters a host's queued ones (``lua/purge.lua``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from scrapy_banker.core.directives import Action, ControlError, ControlState
from scrapy_banker.redis.keys import (
    CRAWL_DONE,
    CRAWL_PAGES,
    HOST_HELD,
    HOST_PAGES,
    TOPIC_PAGES,
    decode,
)
from scrapy_banker.redis.scripts import ScriptCall

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy_banker.redis.frontier.link import FrontierLink

logger = logging.getLogger(__name__)

__all__ = ["LOG_LENGTH", "BudgetCounts", "ControlChannel", "check_cluster"]

#: Actions the log keeps (newest first).
LOG_LENGTH = 1000


def check_cluster(cluster: bool, action: Action) -> None:
    """Topic and crawl budgets need a single server (see the module docstring)."""
    if cluster and action.verb == "budget" and not _is_host(action.target):
        raise ControlError(
            f"budget {action.target}: topic and crawl budgets need a single Redis server; "
            "on Redis Cluster only host budgets are counted (in the host's partition)"
        )


def _is_host(target: str) -> bool:
    return target != "crawl" and not target.startswith("topic:")


@dataclass
class BudgetCounts:
    """Pages charged and requests held over a budget, as Redis has them now."""

    #: Host -> pages charged (fetched, or leased to be fetched).
    hosts: dict[str, int] = field(default_factory=dict)
    #: Host -> requests held over its budget (or its topic's, or the crawl's).
    held: dict[str, int] = field(default_factory=dict)
    topics: dict[str, int] = field(default_factory=dict)
    crawl: int = 0
    #: Pages charged to the crawl budget that were fetched and acked.
    crawl_done: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "hosts": self.hosts, "held": self.held, "topics": self.topics, "crawl": self.crawl,
            "crawl_done": self.crawl_done,
        }  # fmt: skip


class ControlChannel:
    """The control document, the action log and the budget counts of one crawl."""

    def __init__(self, link: FrontierLink) -> None:
        self.link = link
        self.keyspace = link.keyspace
        self.client = link.client

    # -- the document -----------------------------------------------------------------

    def load(self) -> ControlState:
        """The directives in force; :class:`ControlError` if the key holds garbage."""
        raw = self.client.get(self.keyspace.control)
        return parse_state(raw)

    def act(self, action: Action, *, who: str, now: float) -> ControlState:
        """Apply ``action`` atomically; the new state.  Logged (who, when, what)."""
        check_cluster(self.link.cluster, action)
        key = self.keyspace.control
        while True:  # compare-and-set: two operators acting at once both land
            raw = self.client.get(key)
            state = parse_state(raw).apply(action)
            text = json.dumps(state.to_json(), sort_keys=True)
            before = "" if raw is None else decode(raw, lossy=True)
            call = ScriptCall([key], [before, text])
            if int(self.link.scripts.values("control_set", [call])[0]):
                break
        entry = {"at": now, "who": who, "version": state.version, **action.to_json()}
        if action.urls and len(action.urls) > 20:
            entry["urls"] = [*action.urls[:20], f"... {len(action.urls) - 20} more"]
        log = self.keyspace.control_log
        self.client.lpush(log, json.dumps(entry, sort_keys=True))
        self.client.ltrim(log, 0, LOG_LENGTH - 1)
        logger.info("Control: %s by %s (version %d)", action.describe(), who, state.version)
        return state

    def log(self, limit: int = 50) -> list[dict[str, Any]]:
        """The latest actions, newest first (unreadable lines are shown as such)."""
        out: list[dict[str, Any]] = []
        for raw in self.client.lrange(self.keyspace.control_log, 0, max(0, limit - 1)):
            try:
                entry = json.loads(decode(raw, lossy=True))
            except ValueError:
                entry = None
            out.append(entry if isinstance(entry, dict) else {"unreadable": decode(raw, True)})
        return out

    # -- hosts ---------------------------------------------------------------------------

    def note_hosts(self, hosts: Iterable[str]) -> None:
        """Remember host names the crawl queued requests of (what actions accept)."""
        hosts = list(hosts)
        if hosts:
            self.client.sadd(self.keyspace.known_hosts, *hosts)

    def note_topics(self, topics: Iterable[str]) -> None:
        """Remember topics the crawl queued requests under."""
        topics = list(topics)
        if topics:
            self.client.sadd(self.keyspace.known_topics, *topics)

    def known_topics(self) -> set[str]:
        return {decode(t, lossy=True) for t in self.client.smembers(self.keyspace.known_topics)}

    def known(self, host: str) -> bool:
        return bool(self.client.sismember(self.keyspace.known_hosts, host))

    def known_hosts(self) -> set[str]:
        return {decode(h, lossy=True) for h in self.client.smembers(self.keyspace.known_hosts)}

    # -- budgets ------------------------------------------------------------------------

    def counts(self, partitions: Iterable[int] | None = None) -> BudgetCounts:
        """Pages charged and requests held, from every partition's meta (one round trip)."""
        link = self.link
        chosen = range(link.partitions) if partitions is None else list(partitions)
        out = BudgetCounts()
        pipe = self.client.pipeline(transaction=False)
        for p in chosen:
            pipe.hgetall(link.keys(p).meta)
        for meta in pipe.execute():
            for raw_field, raw_value in meta.items():
                name = decode(raw_field, lossy=True)
                for family, book in ((HOST_PAGES, out.hosts), (HOST_HELD, out.held)):
                    host = family.key_of(name)
                    if host is not None:
                        book[host] = book.get(host, 0) + int(raw_value)
        if not link.cluster:
            for raw_field, raw_value in self.client.hgetall(self.keyspace.budget).items():
                name = decode(raw_field, lossy=True)
                topic = TOPIC_PAGES.key_of(name)
                if name == CRAWL_PAGES.name:
                    out.crawl = int(raw_value)
                elif name == CRAWL_DONE.name:
                    out.crawl_done = int(raw_value)
                elif topic is not None:
                    out.topics[topic] = int(raw_value)
        return out

    def release(self, partitions: Iterable[int], host: str = "") -> int:
        """Put held requests back in their queues (``host``'s only, or all); how many."""
        link = self.link
        calls = []
        for p in partitions:
            k = link.keys(p)
            calls.append(ScriptCall([k.levels, k.meta, k.over], [host]))
        if not calls:
            return 0
        return sum(int(n) for n in link.scripts.values("release", calls))

    def held_partitions(self) -> list[int]:
        """Partitions with requests held over a budget."""
        pipe = self.client.pipeline(transaction=False)
        for p in range(self.link.partitions):
            pipe.llen(self.link.keys(p).over)
        return [p for p, n in enumerate(pipe.execute()) if n]

    # -- purge --------------------------------------------------------------------------

    def purge(self, host: str, partition: int, url_of: Callable[[str], str | None]) -> int:
        """Dead-letter ``host``'s queued and held requests (reason ``purged``); how many.

        ``url_of(payload)`` is the URL a payload would fetch (None: unreadable,
        left alone).  Entries are matched by host name in Python -- payloads
        may be compressed -- then removed by exact value in one script per
        chunk, so one leased meanwhile is simply not there any more.
        """
        from scrapy_banker.core.hashing import host_of

        link = self.link
        k = link.keys(partition)
        levels = [decode(lv) for lv in self.client.zrange(k.levels, 0, -1)]
        found: list[str] = []
        for level in levels:
            for raw in self.client.lrange(k.level(level), 0, -1):
                entry = decode(raw, lossy=True)
                _, _, payload = entry.partition(" ")
                url = url_of(payload)
                if url is not None and host_of(url) == host:
                    found += [level, entry]
        total = 0
        chunk = 200
        for i in range(0, max(len(found), 2), 2 * chunk):
            args: list[str | int] = [partition, host, *found[i : i + 2 * chunk]]
            call = ScriptCall([k.levels, k.meta, k.over, k.dead, *link.budget_keys], args)
            total += int(link.scripts.values("purge", [call])[0])
        if total:
            self.client.incr(self.keyspace.finished)
        return total


def parse_state(raw: object) -> ControlState:
    """The control document read from Redis (None: nothing set)."""
    if raw is None:
        return ControlState()
    try:
        data = json.loads(decode(raw, lossy=True))
    except ValueError as exc:
        raise ControlError(f"the control document is not JSON: {exc}") from None
    return ControlState.from_json(data)


#: What a worker's read of the document may raise besides bad JSON.
CONTROL_ERRORS = (ControlError, redis.RedisError)
