"""Carrying out an operator's action on a fleet: what ``scrapy banker`` and the dashboard share.

:class:`Controller` turns an operator's words into a checked
:class:`~scrapy_banker.core.control.Action` -- a host the crawl never queued,
a topic it does not have, a negative budget, a URL it cannot fetch are
refused with :class:`~scrapy_banker.core.control.ControlError` before
anything changes -- and carries it out through the fleet's keyspace
(:class:`~scrapy_banker.redis.control.ControlChannel`): a directive for the
workers to read, plus for ``purge`` the host's queued requests moved to the
dead letters (reason ``purged``, requeueable with ``scrapy banker
deadletters --requeue``) and for ``inject`` the URLs queued like any other
request (deduplicated fleet-wide, fetched by the spider's ``parse``, with
a topic if given).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy import Request
from scrapy.utils.misc import load_object

from scrapy_banker.core.control import Action, ControlError, ControlState, parse_action
from scrapy_banker.core.meta import META_TOPIC
from scrapy_banker.core.ops import EnqueueOp
from scrapy_banker.ops.jobdir_view import jobdir_hosts_and_topics
from scrapy_banker.redis.control import ControlChannel
from scrapy_banker.scheduler.classifier import Classifier
from scrapy_banker.scheduler.control_file import ControlFile
from scrapy_banker.scheduler.downloader import DownloaderView
from scrapy_banker.scheduler.serialize import MalformedPayload, RequestCodec

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scrapy.settings import BaseSettings

    from scrapy_banker.redis.frontier import RedisFrontier
    from scrapy_banker.settings import BankerConfig

logger = logging.getLogger(__name__)

__all__ = ["Controller", "JobdirController", "Outcome", "check_url"]


def check_url(url: str) -> None:
    """``ValueError`` unless ``url`` is an absolute http(s) URL with a host."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError("expected an absolute http:// or https:// URL with a host name")


@dataclass
class Outcome:
    """What an action did."""

    action: Action
    state: ControlState
    purged: int = 0
    injected: int = 0
    duplicates: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "action": self.action.to_json(),
            "done": self.action.describe(),
            "version": self.state.version,
        }
        if self.action.verb == "purge":
            out["purged"] = self.purged
        if self.action.verb == "inject":
            out["injected"], out["duplicates"] = self.injected, self.duplicates
        return out


class JobdirController:
    """Checks and carries out operator actions on a single process's JOBDIR
    (:mod:`scrapy_banker.scheduler.control_file`)."""

    def __init__(self, jobdir: str, config: BankerConfig) -> None:
        self.jobdir = jobdir
        self.config = config
        self.file = ControlFile(jobdir)

    def parse(
        self, verb: str, args: Sequence[str], *, topic: str | None = None, force: bool = False
    ) -> Action:
        """The checked action; :class:`ControlError` names what is wrong (nothing changed)."""
        if verb in ("purge", "inject"):
            raise ControlError(
                f"{verb}: a single process's queue is its own memory; {verb} needs a crawl "
                "that runs on Redis (the BankerRedisScheduler)"
            )
        try:
            hosts, topics = jobdir_hosts_and_topics(self.jobdir)
        except ValueError as exc:
            raise ControlError(str(exc)) from None
        action = parse_action(verb, args, topics=self.config.topic_names() | topics)
        target = action.target
        is_host = target != "crawl" and not target.startswith("topic:")
        if is_host and not force and target not in hosts:
            raise ControlError(
                f"HOST: the JOBDIR holds no pending request of {target!r}; --force sets it anyway"
            )
        return action

    def execute(self, action: Action, *, who: str, now: float) -> Outcome:
        return Outcome(action, self.file.act(action, who=who, now=now))


class Controller:
    """Checks and carries out operator actions on the fleet of ``frontier``."""

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
        action = parse_action(verb, args, topics=topics, topic=topic, check_url=check_url)
        target = action.target
        is_host = target and target != "crawl" and not target.startswith("topic:")
        if is_host and not force and not self.channel.known(target):
            known = sorted(self.channel.known_hosts())
            hint = ", ".join(known[:5]) + (", ..." if len(known) > 5 else "")
            raise ControlError(
                f"HOST: this crawl has queued no request of {target!r}"
                + (f" (its hosts include {hint})" if known else " (it has queued nothing yet)")
                + "; --force sets it anyway"
            )
        return action

    # -- doing --------------------------------------------------------------------------

    def execute(self, action: Action, *, who: str, now: float) -> Outcome:
        """Carry out ``action`` (checked by :meth:`parse`) and log it."""
        outcome = Outcome(action, self.channel.act(action, who=who, now=now))
        if action.verb == "purge":
            outcome.purged = self._purge(action.target)
        elif action.verb == "inject":
            outcome.injected, outcome.duplicates = self._inject(action.urls, action.topic)
        elif action.verb == "budget":
            # Held requests go back; a worker that has not read the new budget
            # yet holds them again, and puts them back itself when it has.
            self.channel.release(self.channel.held_partitions())
        return outcome

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
