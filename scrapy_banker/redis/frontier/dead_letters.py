"""A partition's dead letters: requests the crawl gave up on, with the reason.

A request lands in its partition's dead-letter list (``{prefix:p}:dead``) when
its fetch began ``max_deliveries`` times without an ack (the reaper,
:mod:`scrapy_banker.redis.frontier.reaper`) or when a worker could not
decode its payload (:meth:`DeadLetters.call`, sent with the worker's
batch).  Each letter is JSON with the payload and the reason; the operator
lists them and may queue one again (``scrapy banker deadletters``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from scrapy_banker.redis.keys import decode
from scrapy_banker.redis.scripts import ScriptCall

if TYPE_CHECKING:
    from scrapy_banker.core.ops import LeaseToken
    from scrapy_banker.redis.frontier.link import FrontierLink

__all__ = ["DeadLetters"]


class DeadLetters:
    """Moves leased requests to their partition's dead letters, lists and requeues them."""

    def __init__(self, link: FrontierLink) -> None:
        self.link = link

    def call(self, token: LeaseToken, reason: str) -> ScriptCall:
        """The ``deadletter`` script's run for a leased request (a batch may mix it)."""
        return self._call(token.partition, token.id, reason)

    def dead_letter(self, partition: int, request_id: str, reason: str) -> None:
        """Move a leased request to the dead-letter list now (e.g. a malformed payload)."""
        self.link.scripts.values("deadletter", [self._call(partition, request_id, reason)])

    def dead_letters(self, partition: int) -> list[dict[str, Any]]:
        """The partition's dead letters; a binary payload comes back lossily decoded."""
        out: list[dict[str, Any]] = []
        for raw in self.link.client.lrange(self.link.keys(partition).dead, 0, -1):
            text = decode(raw, lossy=True)
            try:
                out.append(json.loads(text))
            except ValueError:
                out.append({"raw": text, "reason": "unreadable dead letter"})
        return out

    def requeue_dead(self, partition: int, letter: str, priority: int = 0) -> str | None:
        """Queue one dead letter again; its new id, or None if it is gone or has no payload.

        ``letter`` is the list entry exactly as stored (what
        :meth:`dead_letters` decodes): the script removes that entry and
        queues its payload in one step, so a letter is never lost nor queued
        twice.  Only the operator's ``scrapy banker deadletters --requeue``
        calls this; follow it with :meth:`WorkCensus.bump_finished
        <scrapy_banker.redis.frontier.census.WorkCensus.bump_finished>`.
        """
        k = self.link.keys(partition)
        (answer,) = self.link.scripts.values(
            "requeue", [ScriptCall([k.dead, k.levels, k.meta], [letter, int(priority)])]
        )  # fmt: skip
        return None if answer is None else decode(answer)

    def _call(self, partition: int, request_id: str, reason: str) -> ScriptCall:
        k = self.link.keys(partition)
        return ScriptCall(
            [k.leases, k.payloads, k.meta, k.dead, *self.link.budget_keys],
            [request_id, reason, partition],
        )
