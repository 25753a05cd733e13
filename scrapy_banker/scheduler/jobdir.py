"""JOBDIR persistence of the local queue: JSON lines per directory bucket, never pickle.

A clean stop writes ``JOBDIR/banker/``: ``state.json`` (topic slices and
round-robin order, the extendible-hash directory) and one JSON-lines file per
bucket in ``queues/``.  The directory is written next to the old one and
swapped in with ``os.replace``, so a crash mid-save keeps the previous clean
state.  Entries that cannot be written or read back are logged, counted and
kept in ``JOBDIR/banker-deadletter.jsonl`` -- outside ``banker/``, which every
clean stop replaces.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import TYPE_CHECKING, Any, TextIO

from scrapy_banker.directory import ExtendibleDirectory
from scrapy_banker.scheduler.classifier import Classified
from scrapy_banker.serialize import MalformedPayload, UnserializableRequest

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request, Spider
    from scrapy.statscollectors import StatsCollector

    from scrapy_banker.scheduler.queue import LocalQueue
    from scrapy_banker.serialize import RequestCodec

logger = logging.getLogger(__name__)

__all__ = ["STATE_VERSION", "JobDir"]

STATE_VERSION = 1


class JobDir:
    """Save and restore one crawl's pending requests under ``JOBDIR``."""

    def __init__(self, jobdir: str, codec: RequestCodec, stats: StatsCollector) -> None:
        self.path = os.path.join(jobdir, "banker")
        self.deadletter_path = os.path.join(jobdir, "banker-deadletter.jsonl")
        self.codec = codec
        self.stats = stats

    def _dead_letter(self, record: dict[str, Any]) -> None:
        with open(self.deadletter_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def save(self, queue: LocalQueue, spider: Spider | None) -> None:
        """Write pending requests and state; atomic, so a crash keeps the last good copy."""
        tmp = self.path + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(os.path.join(tmp, "queues"))
        files: dict[int, TextIO] = {}
        saved = unserializable = 0
        try:
            for entry in queue.entries():
                try:
                    payload = self.codec.encode(entry.item, spider)
                except UnserializableRequest as exc:
                    unserializable += 1
                    logger.error(
                        "Cannot persist %s to JOBDIR, it will not resume: %s", entry.item, exc
                    )
                    self._dead_letter({"url": entry.item.url, "method": entry.item.method,
                                       "error": str(exc), "when": "save"})  # fmt: skip
                    continue
                bucket = queue.directory.bucket_of(entry.key)
                out = files.get(bucket)
                if out is None:
                    path = os.path.join(tmp, "queues", f"{bucket}.jsonl")
                    out = files[bucket] = open(path, "w", encoding="utf-8")  # noqa: SIM115
                line = {
                    "request": json.loads(payload),
                    "topic": entry.topic,
                    "slot": entry.slot,
                    "key": entry.key,
                    "hash": entry.key_hash,
                    "priority": entry.priority,
                    "seq": entry.seq,
                }
                out.write(json.dumps(line, separators=(",", ":")) + "\n")
                saved += 1
        finally:
            for out in files.values():
                out.close()
        state = {
            "version": STATE_VERSION,
            "pending": saved,
            "topics": queue.topics.to_state(),
            "directory": queue.directory.to_state() if not unserializable else None,
        }
        with open(os.path.join(tmp, "state.json"), "w", encoding="utf-8") as f:
            json.dump(state, f)
        shutil.rmtree(self.path, ignore_errors=True)
        os.replace(tmp, self.path)
        self.stats.set_value("banker/jobdir/saved", saved)
        if unserializable:
            self.stats.set_value("banker/jobdir/unserializable", unserializable)
        logger.info("Saved %d pending requests to %s", saved, self.path)

    def restore(
        self,
        queue: LocalQueue,
        spider: Spider | None,
        slot_key: Callable[[Request], str],
        now: float,
    ) -> int:
        """Queue what the last clean stop saved; returns how many requests came back."""
        state_path = os.path.join(self.path, "state.json")
        if not os.path.exists(state_path):
            return 0
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"{state_path}: unsupported state version {state.get('version')!r} "
                f"(this scrapy-banker writes version {STATE_VERSION})"
            )
        queue.topics.restore(state["topics"])
        count_load = True
        if state.get("directory") is not None:
            queue.directory = ExtendibleDirectory.from_state(state["directory"])
            count_load = False
        restored = malformed = 0
        queues = os.path.join(self.path, "queues")
        for name in sorted(os.listdir(queues)) if os.path.isdir(queues) else []:
            with open(os.path.join(queues, name), encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    try:
                        rec = json.loads(line)
                        request = self.codec.decode(json.dumps(rec["request"]), spider)
                        c = Classified(
                            str(rec["topic"]), slot_key(request), str(rec["key"]), int(rec["hash"])
                        )
                        queue.push(request, c, now, priority=int(rec["priority"]),
                                   seq=int(rec["seq"]), count_load=count_load)  # fmt: skip
                        restored += 1
                    except (ValueError, KeyError, TypeError, MalformedPayload) as exc:
                        malformed += 1
                        logger.error(
                            "Skipping malformed JOBDIR entry %s:%d (%s); kept in %s",
                            name, lineno, exc, self.deadletter_path,
                        )  # fmt: skip
                        self._dead_letter({"file": name, "line": lineno, "error": str(exc),
                                           "payload": line.rstrip("\n"),
                                           "when": "restore"})  # fmt: skip
        if malformed and not count_load:
            # The saved directory counted the skipped entries: rebuild loads from what is queued.
            queue.rebuild_directory()
        self.stats.set_value("banker/jobdir/restored", restored)
        if malformed:
            self.stats.set_value("banker/jobdir/malformed", malformed)
        logger.info("Resumed %d pending requests from %s", restored, self.path)
        return restored
