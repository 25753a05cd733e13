"""The operator's read model of one node's JOBDIR (``scrapy banker status --jobdir``).

:class:`~scrapy_banker.scheduler.BankerScheduler` keeps ``JOBDIR/banker/``
(see :mod:`scrapy_banker.scheduler.jobdir`): a snapshot and the journal
appended since, replayed here exactly as a resume would replay them -- so
the view is right during a crawl and after a ``kill -9``, not only after a
clean stop.  What could not be saved or restored is in
``JOBDIR/banker-deadletter.jsonl``.  This module reads those files -- never
writes, never unpickles -- into views with a stable ``to_json()``.

Buckets: after a clean stop the snapshot holds the directory; otherwise the
requests' queue keys are filed into a fresh directory of the default shape
(``BANKER_BUCKET_CAPACITY`` etc. are not known here), as a resume that
rebuilds the directory would.

Budgets (:class:`JobdirBudgets`): the pages fetched per host, per topic and in
all are exact from the files (:attr:`JournalState.pages
<scrapy_banker.core.journal.JournalState.pages>`), and the budgets in force are
the operator's (``JOBDIR/banker/control.json``) over the settings' the caller
passes.  A pending request whose host, topic or crawl is spent is *held over
budget*: a request held at a stop is saved as an ordinary pending one, and a
resume holds it again -- until a budget is raised -- exactly as
:meth:`BudgetBook.over <scrapy_banker.core.directives.BudgetBook.over>` decides
here.
"""

from __future__ import annotations

import fnmatch
import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_banker.core.directives import CRAWL, BudgetBook, BudgetRules, ControlError, ControlState
from scrapy_banker.core.directory import ExtendibleDirectory
from scrapy_banker.core.journal import (
    BadLine,
    JournalState,
    PageCounts,
    UnsupportedSnapshot,
    parse_enqueue,
)
from scrapy_banker.ops.revisits_view import RevisitsView, read_revisits
from scrapy_banker.scheduler.control_file import ControlFile
from scrapy_banker.scheduler.jobdir import DEADLETTERS, SNAPSHOT, live_records, replay

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request

__all__ = [
    "Budget",
    "JobdirBudgets",
    "JobdirEntry",
    "JobdirView",
    "budget_book",
    "budgets_in_force",
    "control_state",
    "find_in_jobdir",
    "held_over",
    "jobdir_budgets",
    "jobdir_directory",
    "read_jobdir",
]

#: Same numbering as :data:`scrapy_banker.ops.fleet_view.SCHEMA_VERSION`.
SCHEMA_VERSION = 1
#: What could not be saved or restored, beside ``banker/``.
_DEADLETTER_FILE = DEADLETTERS


@dataclass(frozen=True)
class JobdirEntry:
    """One saved request line."""

    bucket: int
    line: int
    topic: str
    slot: str
    key: str
    key_hash: int
    priority: int
    request: dict[str, Any]
    #: FIFO order within a lane (the journal's sequence number).
    seq: int = 0


@dataclass
class _Journaled:
    """A snapshot + journal JOBDIR, replayed."""

    state: JournalState
    entries: list[JobdirEntry]
    #: The one saved at a clean stop, else the pending keys filed into a fresh one.
    directory: ExtendibleDirectory[str]


def _journaled(jobdir: str) -> _Journaled:
    """Replay the snapshot and its journal; ``ValueError`` saying in one line what is missing."""
    if not os.path.isdir(jobdir):
        raise ValueError(f"no JOBDIR at {jobdir}")
    path = os.path.join(jobdir, "banker")
    if not os.path.exists(os.path.join(path, SNAPSHOT)):
        raise ValueError(
            f"{jobdir} holds no scrapy-banker state (no banker/{SNAPSHOT}: the crawl used "
            "another scheduler, or never started)"
        )
    try:
        state, files = replay(path)
    except UnsupportedSnapshot as exc:
        raise ValueError(str(exc)) from None
    header = state.header or {}
    saved = header.get("directory")
    directory = None if not saved else ExtendibleDirectory.from_state(saved)
    rebuilt: ExtendibleDirectory[str] | None = None if directory else ExtendibleDirectory()
    records = []
    for _, lineno, line, rec in live_records(state, files):
        try:
            request = json.loads(rec.payload)
            if not isinstance(request, dict):
                raise ValueError("payload is not an object")
        except ValueError:
            state.malformed.append(BadLine(SNAPSHOT, lineno, "unreadable", line))
            continue
        if rebuilt is not None:
            rebuilt.add(rec.key, rec.key_hash, 1)
        records.append((rec, lineno, request))
    final = directory or rebuilt
    assert final is not None
    entries = [
        JobdirEntry(final.bucket_of(rec.key) if directory is None else final.lookup(rec.key_hash),
                    lineno, rec.topic, rec.slot, rec.key, rec.key_hash, rec.priority, request,
                    rec.seq)
        for rec, lineno, request in records
    ]  # fmt: skip
    return _Journaled(state, entries, final)


def jobdir_hosts_and_topics(jobdir: str) -> tuple[set[str], set[str]]:
    """The hosts (download slots) and topics of the requests a JOBDIR holds pending."""
    entries = _journaled(jobdir).entries
    return {e.slot for e in entries}, {e.topic for e in entries}


# -- budgets ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """One budget in force for a request's host, topic or the crawl, and the pages
    fetched against it; a pending request is held over the first one spent
    (:func:`held_over`)."""

    #: The budget's target as ``scrapy banker budget`` takes it: a host, ``topic:NAME``
    #: or ``crawl``.
    target: str
    #: ``host``, ``topic`` or ``crawl``.
    kind: str
    budget: int
    #: Pages fetched against it so far (exact from the JOBDIR's files).
    fetched: int
    #: Who set it: ``operator`` (``scrapy banker budget``, in ``banker/control.json``),
    #: else the setting that gives it (``BANKER_HOST_BUDGET``, ``BANKER_HOST_BUDGETS``,
    #: ``BANKER_TOPICS``, ``BANKER_CRAWL_BUDGET``).
    set_by: str

    @property
    def name(self) -> str:
        """The host or topic name (``crawl`` for the crawl)."""
        return self.target[len("topic:") :] if self.kind == "topic" else self.target

    @property
    def spent(self) -> bool:
        return self.fetched >= self.budget

    def describe(self) -> str:
        """``host budget 12, 12 fetched``, ``topic news budget 10, 10 fetched``..."""
        what = f"topic {self.name} budget" if self.kind == "topic" else f"{self.kind} budget"
        return f"{what} {self.budget}, {self.fetched} fetched"

    def subject(self) -> str:
        """What has been fetched: ``its host (a.test)``, ``its topic (news)``, ``the crawl``."""
        return "the crawl" if self.kind == "crawl" else f"its {self.kind} ({self.name})"

    def release(self, jobdir: str) -> str:
        """How to raise it: the command, and the setting when the settings give it."""
        command = f"scrapy banker budget {self.target} N --jobdir {jobdir}"
        return command if self.set_by == "operator" else f"{command}, or {self.set_by}"

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "kind": self.kind,
            "budget": self.budget,
            "fetched": self.fetched,
            "set_by": self.set_by,
        }


def _host_setting(rules: BudgetRules, host: str) -> str:
    """The setting that gives ``host`` its budget (as :meth:`BudgetRules.host` resolves it)."""
    for pattern, _ in rules.patterns:
        if pattern == host or fnmatch.fnmatchcase(host, pattern):
            return "BANKER_HOST_BUDGETS"
    return "BANKER_HOST_BUDGET"


def budgets_in_force(book: BudgetBook, host: str, topic: str) -> list[Budget]:
    """The budgets a request of ``host`` / ``topic`` is charged against, in the order
    :meth:`BudgetBook.over` tries them (host, topic, crawl), with the pages fetched."""
    rules, state = book.rules, book.state or ControlState()
    out: list[Budget] = []
    budget = rules.host(host, state)
    if budget is not None:
        by = "operator" if state.host(host).budget is not None else _host_setting(rules, host)
        out.append(Budget(host, "host", budget, book.hosts.get(host, 0), by))
    budget = rules.topic(topic, state)
    if budget is not None:
        by = "operator" if state.topic(topic).budget is not None else "BANKER_TOPICS"
        out.append(Budget(f"topic:{topic}", "topic", budget, book.topics.get(topic, 0), by))
    budget = rules.crawl_budget(state)
    if budget is not None:
        by = "operator" if state.crawl_budget is not None else "BANKER_CRAWL_BUDGET"
        out.append(Budget(CRAWL, "crawl", budget, book.crawl, by))
    return out


def held_over(book: BudgetBook, host: str, topic: str) -> Budget | None:
    """The budget a pending request of ``host`` / ``topic`` is held over (None: fetched)."""
    if book.over(host, topic) is None:
        return None
    return next(h for h in budgets_in_force(book, host, topic) if h.spent)


def budget_book(pages: PageCounts, rules: BudgetRules, state: ControlState) -> BudgetBook:
    """A :class:`BudgetBook` as a resume restores it: the files' pages, the budgets in force."""
    book = BudgetBook(rules)
    book.state = state
    book.restore(pages.to_json())
    return book


def control_state(jobdir: str) -> tuple[ControlState, str | None]:
    """The operator's directives in ``JOBDIR/banker/control.json`` (none if absent), and why
    they were not read when the file is not a valid control document."""
    try:
        return ControlFile(jobdir).load(), None
    except (OSError, ControlError) as exc:
        return ControlState(), (
            f"the control file JOBDIR/banker/control.json is not read ({exc}): only the "
            "settings' budgets are shown"
        )


@dataclass(frozen=True)
class JobdirBudgets:
    """The pages a JOBDIR's crawl fetched, the budgets in force, the requests held over them.

    A request is held when any budget in force for it is spent (its host's,
    its topic's, the crawl's); the counts per budget count it under each
    spent one, so raising one budget releases those over that one only.
    """

    #: Pages fetched per host, per topic and in all: exact from the files.
    pages: PageCounts
    #: The settings' budgets, and the operator's directives (which outrank them).
    rules: BudgetRules
    state: ControlState
    #: Pending requests (their payload readable) per host and per topic.
    pending_hosts: dict[str, int]
    pending_topics: dict[str, int]
    #: Pending requests held over a budget, per host and per topic.
    held_hosts: dict[str, int]
    held_topics: dict[str, int]
    #: Host -> budget target -> its pending requests over that spent budget.
    held_over: dict[str, dict[str, int]]
    #: Budget target -> the spent budget (every one some pending request is over).
    over: dict[str, Budget]
    #: Why ``banker/control.json`` was not read (None: read, or absent).
    control_error: str | None = None

    @property
    def held(self) -> int:
        return sum(self.held_hosts.values())

    @property
    def pending(self) -> int:
        return sum(self.pending_hosts.values())

    def held_by_target(self) -> dict[str, int]:
        """Budget target -> pending requests over it."""
        out: dict[str, int] = {}
        for by in self.held_over.values():
            for target, n in by.items():
                out[target] = out.get(target, 0) + n
        return out

    @property
    def crawl_budget(self) -> int | None:
        return self.rules.crawl_budget(self.state)

    @property
    def crawl_spent(self) -> bool:
        budget = self.crawl_budget
        return budget is not None and self.pages.crawl >= budget

    @property
    def in_force(self) -> bool:
        return self.rules.any(self.state)

    def host_budget(self, host: str) -> int | None:
        return self.rules.host(host, self.state)

    def topic_budget(self, topic: str) -> int | None:
        return self.rules.topic(topic, self.state)

    def hosts(self) -> list[str]:
        """The hosts with pending requests or a budget: most held, then most pending, first."""
        every = set(self.pending_hosts)
        every |= {h for h, c in self.state.hosts.items() if c.budget is not None}
        every |= {h for h in self.pages.hosts if self.host_budget(h) is not None}
        held, pending, pages = self.held_hosts, self.pending_hosts, self.pages.hosts
        return sorted(
            every, key=lambda h: (-held.get(h, 0), -pending.get(h, 0), -pages.get(h, 0), h)
        )

    def topics(self) -> list[str]:
        """The topics with pages fetched, pending requests or a budget."""
        every = set(self.pages.topics) | set(self.pending_topics) | set(self.rules.topics)
        every |= {t for t, c in self.state.topics.items() if c.budget is not None}
        return sorted(every)

    def counts_json(self) -> dict[str, Any]:
        """A fleet's budget counts (``scrapy banker control --json``'s ``counts``): pages
        charged and requests held per host, pages per topic and crawl-wide.  On one node
        every page counted was fetched and done, so ``crawl_done`` is ``crawl``."""
        return {
            "hosts": dict(sorted(self.pages.hosts.items())),
            "held": dict(sorted(self.held_hosts.items())),
            "topics": dict(sorted(self.pages.topics.items())),
            "crawl": self.pages.crawl,
            "crawl_done": self.pages.crawl,
        }

    def to_json(self) -> dict[str, Any]:
        pages = self.pages
        by_target = self.held_by_target()
        topics = [
            {
                "name": t,
                "budget": self.topic_budget(t),
                "fetched": pages.topics.get(t, 0),
                "pending": self.pending_topics.get(t, 0),
                "held": self.held_topics.get(t, 0),
            }
            for t in self.topics()
        ]
        hosts = [
            {
                "host": h,
                "budget": self.host_budget(h),
                "fetched": pages.hosts.get(h, 0),
                "pending": self.pending_hosts.get(h, 0),
                "held": self.held_hosts.get(h, 0),
                "held_over": dict(sorted(self.held_over.get(h, {}).items())),
            }
            for h in self.hosts()
        ]
        return {
            "in_force": self.in_force,
            "crawl": {
                "budget": self.crawl_budget,
                "fetched": pages.crawl,
                "spent": self.crawl_spent,
                "pending": self.pending,
                "held": self.held,
            },
            "topics": topics,
            "hosts": hosts,
            "over": [
                {**held.to_json(), "held": by_target.get(target, 0)}
                for target, held in sorted(self.over.items())
            ],
            "control_error": self.control_error,
        }


def _budgets(
    journaled: _Journaled, rules: BudgetRules, state: ControlState, error: str | None
) -> JobdirBudgets:
    """Which pending requests a resume would hold, by :meth:`BudgetBook.over`'s rule."""
    pages = journaled.state.pages
    book = budget_book(pages, rules, state)
    verdict: dict[tuple[str, str], list[Budget]] = {}
    pending_hosts: Counter[str] = Counter()
    pending_topics: Counter[str] = Counter()
    held_hosts: Counter[str] = Counter()
    held_topics: Counter[str] = Counter()
    over_per_host: dict[str, dict[str, int]] = {}
    over: dict[str, Budget] = {}
    for entry in journaled.entries:
        host, topic = entry.slot, entry.topic
        pending_hosts[host] += 1
        pending_topics[topic] += 1
        lane = (host, topic)
        spent = verdict.get(lane)
        if spent is None:
            spent = verdict[lane] = [h for h in budgets_in_force(book, host, topic) if h.spent]
            assert bool(spent) == (book.over(host, topic) is not None)
        if not spent:
            continue
        held_hosts[host] += 1
        held_topics[topic] += 1
        by = over_per_host.setdefault(host, {})
        for held in spent:
            over[held.target] = held
            by[held.target] = by.get(held.target, 0) + 1
    return JobdirBudgets(
        pages=pages, rules=rules, state=state, pending_hosts=dict(pending_hosts),
        pending_topics=dict(pending_topics), held_hosts=dict(held_hosts),
        held_topics=dict(held_topics), held_over=over_per_host, over=over, control_error=error,
    )  # fmt: skip


def jobdir_budgets(
    jobdir: str, rules: BudgetRules, state: ControlState | None = None
) -> JobdirBudgets:
    """The budget counts of a JOBDIR and the pending requests held over a budget.

    ``rules``: the settings' budgets (:meth:`BankerConfig.budgets
    <scrapy_banker.settings.BankerConfig.budgets>`); ``state``: the operator's
    directives, read from ``banker/control.json`` when not given.
    ``ValueError`` with one line when the JOBDIR holds nothing to read.
    """
    journaled = _journaled(jobdir)
    error = None
    if state is None:
        state, error = control_state(jobdir)
    return _budgets(journaled, rules, state, error)


@dataclass(frozen=True)
class JobdirView:
    """What one node's JOBDIR holds since its last clean stop."""

    path: str
    #: Requests the journal holds pending, and those of them whose payload reads back.
    pending: int
    queued: int
    #: topic -> requests saved for it; its time slice and dispatch count.
    topics: dict[str, dict[str, Any]]
    #: bucket -> (requests, distinct queue keys).
    buckets: dict[int, tuple[int, int]]
    #: The slots (hosts) with most saved requests, most first.
    top_slots: tuple[tuple[str, int], ...]
    #: Directory shape: global depth, buckets (the one saved at a clean stop, else the
    #: one a resume would rebuild).
    global_depth: int | None
    n_buckets: int | None
    #: Snapshot and journal lines that are not valid entries.
    malformed: int
    #: ``banker-deadletter.jsonl``: entries, by ``when`` (save / restore).
    dead_letters: int
    dead_letter_kinds: dict[str, int]
    #: Fingerprints the journal records as seen (every request it queued, not
    #: ``dont_filter`` ones).
    seen: int | None
    #: Pages fetched, budgets in force, requests held over them (None: not asked for).
    budgets: JobdirBudgets | None = None
    #: The pages kept for revisits (None: the crawl keeps none).
    revisits: RevisitsView | None = None

    @property
    def over_budget(self) -> int:
        """Pending requests held over a budget (0 when budgets were not read)."""
        return 0 if self.budgets is None else self.budgets.held

    def to_json(self) -> dict[str, Any]:
        out = {
            "schema": SCHEMA_VERSION,
            "kind": "jobdir",
            "path": self.path,
            "pending": self.pending,
            "queued": self.queued,
            "topics": [{"name": n, **t} for n, t in sorted(self.topics.items())],
            "buckets": [
                {"bucket": b, "queued": q, "keys": k} for b, (q, k) in sorted(self.buckets.items())
            ],
            "top_slots": [{"slot": s, "queued": n} for s, n in self.top_slots],
            "directory": {"global_depth": self.global_depth, "buckets": self.n_buckets},
            "malformed": self.malformed,
            "dead_letters": self.dead_letters,
            "dead_letter_kinds": dict(sorted(self.dead_letter_kinds.items())),
            "seen": self.seen,
        }
        if self.budgets is not None:
            # A fleet's status names: totals.queued is what is not held over budget.
            out["totals"] = {
                "queued": self.queued - self.over_budget,
                "over_budget": self.over_budget,
                "dead": self.dead_letters,
            }
            out["budgets"] = self.budgets.to_json()
        if self.revisits is not None:
            out["revisits"] = self.revisits.to_json()
        return out


def read_jobdir(jobdir: str, *, top: int = 10, budgets: BudgetRules | None = None) -> JobdirView:
    """Read a JOBDIR; ``ValueError`` with one line when there is nothing to read.

    With ``budgets`` (the settings' :class:`BudgetRules`) the view also has the
    budget counts and the requests held over budget (:class:`JobdirBudgets`),
    the operator's directives in ``banker/control.json`` outranking the settings.
    """
    journaled = _journaled(jobdir)
    deadletter_path = os.path.join(jobdir, _DEADLETTER_FILE)
    header = journaled.state.header or {}
    entries = journaled.entries
    malformed = len(journaled.state.malformed)
    saved_topics = (header.get("topics") or {}).get("topics") or {}
    directory = journaled.directory
    per_topic: Counter[str] = Counter()
    per_slot: Counter[str] = Counter()
    per_bucket: Counter[int] = Counter()
    keys: dict[int, set[str]] = {}
    for entry in entries:
        per_topic[entry.topic] += 1
        per_slot[entry.slot] += 1
        per_bucket[entry.bucket] += 1
        keys.setdefault(entry.bucket, set()).add(entry.key)
    topics: dict[str, dict[str, Any]] = {}
    for name in sorted(set(per_topic) | set(saved_topics)):
        saved_topic = saved_topics.get(name) or {}
        topics[name] = {
            "queued": per_topic.get(name, 0),
            "slice_s": saved_topic.get("slice_total"),
            "dispatched": saved_topic.get("dispatched"),
        }
    kinds: Counter[str] = Counter()
    dead = 0
    if os.path.exists(deadletter_path):
        with open(deadletter_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                dead += 1
                try:
                    kinds[str(json.loads(line).get("when", "unknown"))] += 1
                except (ValueError, AttributeError):
                    kinds["unreadable"] += 1
    return JobdirView(
        path=jobdir,
        pending=len(journaled.state.live),
        queued=sum(per_bucket.values()),
        topics=topics,
        buckets={b: (n, len(keys[b])) for b, n in per_bucket.items()},
        top_slots=tuple(per_slot.most_common(top)),
        global_depth=directory.global_depth,
        n_buckets=directory.n_buckets,
        malformed=malformed,
        dead_letters=dead,
        dead_letter_kinds=dict(kinds),
        seen=len(journaled.state.seen()),
        budgets=None if budgets is None else _budgets(journaled, budgets, *control_state(jobdir)),
        revisits=read_revisits(jobdir, time.time()),
    )


def jobdir_directory(jobdir: str) -> ExtendibleDirectory[str]:
    """The extendible-hash directory a resume would start from.

    The one saved at a clean stop, else the pending requests' keys filed
    into a default-shaped one.
    """
    return _journaled(jobdir).directory


@dataclass(frozen=True)
class JobdirFind:
    """Where one request is in a JOBDIR."""

    #: ``queued`` (saved, fetched when the crawl resumes), ``over budget`` (saved, and
    #: held again at a resume until :attr:`held`'s budget is raised), ``dead``,
    #: ``done`` (seen, nothing saved) or ``unknown``.
    state: str
    bucket: int | None
    seen: bool | None
    entry: JobdirEntry | None
    ahead: int | None
    dead_reason: str | None
    #: Pending and over budget: the budget it is held over.
    held: Budget | None = None
    #: Pending and not held: the budgets in force for it (host, topic, crawl).
    budgets: tuple[Budget, ...] = ()
    #: Why ``banker/control.json`` was not read (None: read, or absent).
    control_error: str | None = None


def find_in_jobdir(
    jobdir: str,
    request: Request,
    key_hash: int,
    fingerprint: Callable[[Request], str],
    budgets: BudgetRules | None = None,
) -> JobdirFind:
    """Find ``request`` (by fingerprint) among the pending requests, the dead letters
    and the seen set.  Journal records carry the fingerprint: no request is decoded.

    With ``budgets`` (the settings' :class:`BudgetRules`), a pending request
    whose host, topic or crawl is spent -- the operator's budgets in
    ``banker/control.json`` outranking the settings' -- is ``over budget``.
    """
    wanted = fingerprint(request)
    journaled = _journaled(jobdir)
    deadletter_path = os.path.join(jobdir, _DEADLETTER_FILE)
    found: JobdirEntry | None = None
    lane: list[JobdirEntry] = []
    fps = {e.seq: fp for e in journaled.entries if (fp := journaled.state.live.get(e.seq))}
    for entry in journaled.entries:
        if found is None and fps.get(entry.seq) == wanted:
            found = entry
        lane.append(entry)
    seen: bool | None = wanted in journaled.state.seen()
    bucket: int | None = journaled.directory.lookup(key_hash)
    ahead = 0
    if found is not None:
        # Ahead in its lane: same topic and slot, served by priority then FIFO.
        ahead = sum(
            1 for e in lane
            if e.topic == found.topic and e.slot == found.slot
            and (-e.priority, e.seq) < (-found.priority, found.seq)
        )  # fmt: skip
        bucket = found.bucket
    dead_reason = None
    if found is None and os.path.exists(deadletter_path):
        with open(deadletter_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and (
                    rec.get("url") == request.url or _payload_url(rec) == request.url
                ):
                    dead_reason = f"{rec.get('when', '?')}: {rec.get('error', '?')}"
                    break
    held: Budget | None = None
    in_force: tuple[Budget, ...] = ()
    error: str | None = None
    if found is not None and budgets is not None:
        control, error = control_state(jobdir)
        book = budget_book(journaled.state.pages, budgets, control)
        held = held_over(book, found.slot, found.topic)
        in_force = tuple(budgets_in_force(book, found.slot, found.topic))
    if found is not None:
        state = "queued" if held is None else "over budget"
    elif dead_reason is not None:
        state = "dead"
    elif seen:
        state = "done"
    else:
        state = "unknown"
    return JobdirFind(
        state, bucket, seen, found, ahead if found else None, dead_reason, held, in_force, error
    )


def _payload_url(rec: dict[str, Any]) -> str | None:
    """The URL of a dead-lettered journal line, if it can be read."""
    payload = rec.get("payload")
    if not isinstance(payload, str):
        return None
    try:
        return str(json.loads(parse_enqueue(payload + "\n").payload).get("url"))
    except (ValueError, AttributeError):
        return None
