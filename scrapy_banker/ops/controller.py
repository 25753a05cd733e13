"""Carrying out an operator's action on a fleet: what ``scrapy banker`` and the dashboard share.

:class:`Controller` turns an operator's words into a checked
:class:`~scrapy_banker.core.directives.Action` -- a host the crawl never queued,
a topic it does not have, a negative budget, a URL it cannot fetch are
refused with :class:`~scrapy_banker.core.directives.ControlError` before
anything changes -- and carries it out through the fleet's keyspace
(:class:`~scrapy_banker.redis.frontier.control_channel.ControlChannel`): a directive for the
workers to read, plus for ``purge`` the host's queued requests moved to the
dead letters (reason ``purged``, requeueable with ``scrapy banker
deadletters --requeue``) and for ``inject`` the URLs queued like any other
request (deduplicated fleet-wide, fetched by the spider's ``parse``, with
a topic if given).

A HOST is read as the crawl keys it (:func:`host_target`): a URL or
``HOST:PORT`` is its download slot, the host name without port, and the
outcome's ``notes`` say so; an unknown host is refused naming the hosts the
operator likely meant (:func:`unknown_host`).
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from scrapy import Request
from scrapy.utils.misc import load_object
from w3lib.url import safe_url_string

from scrapy_banker.core.directives import (
    CRAWL,
    FLEET,
    JOBDIR,
    VERBS,
    Action,
    ControlError,
    ControlState,
    get_verb,
    parse_action,
)
from scrapy_banker.core.hashing import host_of
from scrapy_banker.core.meta import META_TOPIC
from scrapy_banker.core.ops import EnqueueOp
from scrapy_banker.ops.jobdir_view import jobdir_budgets, jobdir_hosts_and_topics
from scrapy_banker.redis.frontier.control_channel import ControlChannel
from scrapy_banker.scheduler.classifier import Classifier
from scrapy_banker.scheduler.control_file import ControlFile
from scrapy_banker.scheduler.downloader import DownloaderView
from scrapy_banker.scheduler.serialize import MalformedPayload, RequestCodec

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from scrapy.settings import BaseSettings

    from scrapy_banker.redis.frontier import RedisFrontier
    from scrapy_banker.settings import BankerConfig

logger = logging.getLogger(__name__)

__all__ = [
    "Controller",
    "JobdirController",
    "Outcome",
    "check_url",
    "close_hosts",
    "host_target",
    "unknown_host",
]

#: How many known hosts an "unknown host" refusal names at most.
HOSTS_NAMED = 5


def check_url(url: str) -> None:
    """``ValueError`` unless ``url`` is an absolute http(s) URL with a host."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError("expected an absolute http:// or https:// URL with a host name")


def host_target(text: str) -> tuple[str, str | None]:
    """An operator's HOST as the crawl keys it, and a note when that changed what was typed.

    The crawl keys a host by its download slot: the request URL's host name
    -- lower-cased, IDNA-encoded, without scheme, credentials, port or path
    (:func:`~scrapy_banker.core.hashing.host_of`).  So ``127.0.0.1:8731``,
    ``http://127.0.0.1:8731/page`` and ``a.test/x`` are taken as
    ``127.0.0.1`` and ``a.test``, and the note says so.  ``topic:NAME``,
    ``crawl``, a plain host name and a bare IPv6 address are returned as
    given; what is not a host at all is left for
    :func:`~scrapy_banker.core.directives.parse_action` to refuse.
    """
    given = text.strip()
    if given == CRAWL or given.startswith("topic:"):
        return text, None
    if "/" not in given and given.count(":") > 1 and not given.startswith("["):
        return text, None  # a bare IPv6 address: as given
    head, sep, port = given.rpartition(":")
    urlish = (
        "://" in given
        or "/" in given
        or (sep and port.isascii() and port.isdigit() and head)
        or not given.isascii()
    )
    if not urlish:
        return text, None
    url = given if "://" in given else f"http://{given}"
    try:
        host = host_of(safe_url_string(url))
    except ValueError:
        return text, None
    if not host or host == given.lower():
        return text, None
    return host, (
        f"{given!r} taken as host {host!r}: the crawl keys a host by its download slot, "
        "the host name without scheme, port or path"
    )


def close_hosts(host: str, known: Collection[str], n: int = 3) -> list[str]:
    """The known hosts an operator typing ``host`` most likely meant, best first.

    Hosts of the same site (``example.com`` for ``www.example.com`` and the
    reverse) first, then near spellings (``exmaple.com``, ``127.0.0.2``).
    """
    related = sorted(k for k in known if k.endswith("." + host) or host.endswith("." + k))
    near = difflib.get_close_matches(host, list(known), n=n, cutoff=0.8)
    return list(dict.fromkeys([*related, *near]))[:n]


def unknown_host(host: str, given: str, known: Collection[str], where: str) -> ControlError:
    """The refusal of a host the crawl holds no request of, naming the ones it likely meant.

    ``where`` ends in "of": "this crawl has queued no request of".  ``given``:
    the operator's words, named when they were read as another host
    (:func:`host_target`).
    """
    close = close_hosts(host, known)
    shown = list(dict.fromkeys([*close, *sorted(known)]))
    listed = (
        "its hosts include " + ", ".join(shown[:HOSTS_NAMED])
        + (", ..." if len(shown) > HOSTS_NAMED else "")
        if shown
        else "it has no request of any host yet"
    )  # fmt: skip
    typed = given.strip()
    if typed.lower() != host:
        listed = f"read from {typed!r}; {listed}"
    hint = f"; did you mean {' or '.join(close)}? " if close else "; "
    return ControlError(f"HOST: {where} {host!r} ({listed}){hint}--force sets it anyway")


class _Words:
    """The operator's words made the crawl's (:func:`host_target`), and what was noted.

    :meth:`parse` notes how it read a HOST; :meth:`execute` of the same action
    puts the notes in its :class:`Outcome` (the dashboard calls the two in turn).
    """

    _noted: tuple[Action, list[str]] | None = None

    @staticmethod
    def _read(verb: str, args: Sequence[str]) -> tuple[list[str], list[str]]:
        spec = VERBS.get(verb)
        if spec is None or not spec.takes_host or not args:
            return list(args), []
        target, note = host_target(args[0])
        return [target, *args[1:]], [] if note is None else [note]

    def _note(self, action: Action, notes: list[str]) -> Action:
        self._noted = (action, notes)
        return action

    def _notes(self, action: Action) -> list[str]:
        noted, self._noted = self._noted, None
        return list(noted[1]) if noted is not None and noted[0] == action else []


@dataclass
class Outcome:
    """What an action did."""

    action: Action
    state: ControlState
    purged: int = 0
    injected: int = 0
    duplicates: int = 0
    #: What the operator's words were taken as (a URL or host:port read as its host).
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "action": self.action.to_json(),
            "done": self.action.describe(),
            "version": self.state.version,
        }
        if self.notes:
            out["notes"] = list(self.notes)
        if self.action.verb == "purge":
            out["purged"] = self.purged
        if self.action.verb == "inject":
            out["injected"], out["duplicates"] = self.injected, self.duplicates
        return out

    def effects(self) -> str:
        """What the action did beyond the directives, as the end of a sentence ("" if nothing)."""
        if self.action.verb == "purge":
            return f"; {self.purged} queued requests dead-lettered (reason 'purged')"
        if self.action.verb == "inject":
            return f"; {self.injected} queued, {self.duplicates} already seen"
        return ""


class ControlTarget(Protocol):
    """Where an operator's actions go: a fleet's control document or a JOBDIR's file.

    The command line and the dashboard speak to either through this, and
    never ask which one it is.
    """

    config: BankerConfig
    #: ``FLEET`` or ``JOBDIR`` (:mod:`scrapy_banker.core.directives`): the verbs it carries out.
    where: str
    #: When an action is in force, as the end of "in force ...".
    within: str

    def place(self) -> dict[str, str]:
        """Which crawl, for a JSON answer: ``{"prefix": ...}`` or ``{"jobdir": ...}``."""

    def parse(
        self, verb: str, args: Sequence[str], *, topic: str | None = None, force: bool = False
    ) -> Action: ...

    def execute(self, action: Action, *, who: str, now: float) -> Outcome: ...

    def load(self) -> ControlState:
        """The directives in force (:class:`ControlError` if the document holds garbage)."""

    def log(self, limit: int = 50) -> list[dict[str, Any]]:
        """The latest actions, newest last."""

    def counts_json(self, state: ControlState) -> dict[str, Any]:
        """Pages charged and requests held per host, pages per topic and crawl-wide."""


class JobdirController(_Words):
    """Checks and carries out operator actions on a single process's JOBDIR
    (:mod:`scrapy_banker.scheduler.control_file`)."""

    where = JOBDIR
    within = "in the crawl on this JOBDIR within a second"

    def __init__(self, jobdir: str, config: BankerConfig) -> None:
        self.jobdir = jobdir
        self.config = config
        self.file = ControlFile(jobdir)

    def parse(
        self, verb: str, args: Sequence[str], *, topic: str | None = None, force: bool = False
    ) -> Action:
        """The checked action; :class:`ControlError` names what is wrong (nothing changed).

        A verb a single process cannot carry out (:data:`~scrapy_banker.core.directives.VERBS`
        says where each can) is refused before the JOBDIR is read.
        """
        get_verb(verb, JOBDIR)
        try:
            hosts, topics = jobdir_hosts_and_topics(self.jobdir)
        except ValueError as exc:
            raise ControlError(str(exc)) from None
        words, notes = self._read(verb, args)
        action = parse_action(verb, words, topics=self.config.topic_names() | topics, where=JOBDIR)
        target = action.target
        is_host = target != CRAWL and not target.startswith("topic:")
        if is_host and not force and target not in hosts:
            raise unknown_host(target, args[0], hosts, "the JOBDIR holds no pending request of")
        return self._note(action, notes)

    def execute(self, action: Action, *, who: str, now: float) -> Outcome:
        notes = self._notes(action)
        return Outcome(action, self.file.act(action, who=who, now=now), notes=notes)

    def place(self) -> dict[str, str]:
        return {"jobdir": self.jobdir}

    def load(self) -> ControlState:
        return self.file.load()

    def log(self, limit: int = 50) -> list[dict[str, Any]]:
        return self.file.log(limit)

    def counts_json(self, state: ControlState) -> dict[str, Any]:
        """Exact from the JOBDIR's files: the snapshot's counts plus the journal's pages."""
        return jobdir_budgets(self.jobdir, self.config.budgets(), state).counts_json()


class Controller(_Words):
    """Checks and carries out operator actions on the fleet of ``frontier``."""

    where = FLEET
    within = "fleet-wide within a heartbeat"

    def __init__(self, frontier: RedisFrontier, config: BankerConfig, fingerprinter: Any) -> None:
        self.frontier = frontier
        self.config = config
        self.channel = ControlChannel(frontier.link)
        self.classifier = Classifier(config, DownloaderView(), None)
        self.codec = RequestCodec(config.serialize_allowed_classes)
        self.fingerprinter = fingerprinter

    @classmethod
    def from_settings(
        cls, frontier: RedisFrontier, config: BankerConfig, settings: BaseSettings
    ) -> Controller:
        """With the project's request fingerprinter (what the workers deduplicate by)."""
        fp_cls = load_object(settings.get("REQUEST_FINGERPRINTER_CLASS"))
        if hasattr(fp_cls, "from_crawler"):
            fingerprinter = fp_cls.from_crawler(SimpleNamespace(settings=settings))
        else:
            fingerprinter = fp_cls()
        return cls(frontier, config, fingerprinter)

    # -- checking ---------------------------------------------------------------------

    def parse(
        self, verb: str, args: Sequence[str], *, topic: str | None = None, force: bool = False
    ) -> Action:
        """The checked action; :class:`ControlError` names what is wrong (nothing changed)."""
        topics = self.config.topic_names() | self.channel.known_topics()
        words, notes = self._read(verb, args)
        action = parse_action(
            verb, words, topics=topics, topic=topic, check_url=check_url, where=FLEET
        )
        target = action.target
        is_host = target and target != CRAWL and not target.startswith("topic:")
        if is_host and not force and not self.channel.known(target):
            known = self.channel.known_hosts()
            raise unknown_host(target, args[0], known, "this crawl has queued no request of")
        return self._note(action, notes)

    # -- doing --------------------------------------------------------------------------

    def execute(self, action: Action, *, who: str, now: float) -> Outcome:
        """Carry out ``action`` (checked by :meth:`parse`) and log it."""
        notes = self._notes(action)
        outcome = Outcome(action, self.channel.act(action, who=who, now=now), notes=notes)
        if action.verb == "purge":
            outcome.purged = self._purge(action.target)
        elif action.verb == "inject":
            outcome.injected, outcome.duplicates = self._inject(action.urls, action.topic)
        elif action.verb == "budget":
            # Held requests go back; a worker that has not read the new budget
            # yet holds them again, and puts them back itself when it has.
            self.channel.release(self.channel.held_partitions())
        return outcome

    def place(self) -> dict[str, str]:
        return {"prefix": self.channel.keyspace.prefix}

    def load(self) -> ControlState:
        return self.channel.load()

    def log(self, limit: int = 50) -> list[dict[str, Any]]:
        return self.channel.log(limit)

    def counts_json(self, state: ControlState) -> dict[str, Any]:
        """Counted in Redis, with the leases."""
        return self.channel.counts().to_json()

    def _partition(self, url: str) -> int:
        c = self.classifier.classify(Request(url))
        return c.key_hash % self.frontier.partitions

    def _url_of(self, payload: str) -> str | None:
        try:
            url = self.codec.payload_dict(payload).get("url")
        except MalformedPayload:
            return None
        return url if isinstance(url, str) else None

    def _purge(self, host: str) -> int:
        partitions = {self._partition(f"http://{host}/"), self._partition(f"https://{host}/")}
        purged = sum(self.channel.purge(host, p, self._url_of) for p in partitions)
        logger.info("Purged %d queued requests of %s", purged, host)
        return purged

    def _inject(self, urls: Sequence[str], topic: str | None) -> tuple[int, int]:
        ops = []
        hosts = set()
        for url in urls:
            meta = {} if topic is None else {META_TOPIC: topic}
            request = Request(url, meta=meta)
            c = self.classifier.classify(request)
            hosts.add(c.slot)
            ops.append(
                EnqueueOp(
                    c.key_hash % self.frontier.partitions,
                    self.fingerprinter.fingerprint(request).hex(),
                    self.codec.encode_compact(request, None),
                    0,
                    False,
                )
            )
        results = self.frontier.enqueue_many(ops)
        self.channel.note_hosts(hosts)
        added = sum(1 for r in results if r is not None)
        return added, len(results) - added
