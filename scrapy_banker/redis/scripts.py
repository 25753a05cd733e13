"""The one way the frontier runs its Lua scripts, for one call or a thousand.

Each script (``lua/<name>.lua``) is read once per process, loaded once per
server with ``SCRIPT LOAD`` and run by raw ``EVALSHA`` in a
non-transactional pipeline: redis-py's cluster pipeline refuses script
objects, and raw commands work the same on a single server.  A single call is
a batch of one, so production and tests take the same path.

A server restarted (or ``SCRIPT FLUSH``-ed) since the script was loaded
answers ``NOSCRIPT``: the script is loaded again and only those calls are
sent again.  Every script is idempotent or deduplicated (enqueue by its seen
set), so re-sending is a duplicate at worst, never a loss.

The pop script refuses with an error reply -- ``NOTOWNER`` (fenced off) or
``BUSY`` (a hand-over still waits for the previous owner's leases) -- which
redis-py turns into exceptions; :meth:`ScriptRunner.run` turns them into
:class:`Fenced` and :class:`Busy` values in place, so a batch of pops on
many partitions is sorted by outcome instead of failing on the first.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from redis.cluster import RedisCluster

__all__ = ["Busy", "Fenced", "Refusal", "ScriptCall", "ScriptRunner"]

#: How often a batch is sent while servers keep losing the scripts.
_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One run of a script: its keys (all of one hash slot) and arguments."""

    keys: Sequence[str]
    args: Sequence[str | int]


@dataclass(frozen=True, slots=True)
class Refusal:
    """An error reply a script gives on purpose; ``reply`` is its text."""

    reply: str


@dataclass(frozen=True, slots=True)
class Fenced(Refusal):
    """``NOTOWNER``: the partition's owner key names another node or epoch."""


@dataclass(frozen=True, slots=True)
class Busy(Refusal):
    """``BUSY``: leases of an older epoch are still out; the new owner waits."""


@functools.cache
def _sources() -> dict[str, str]:
    """Every script by name; ``-- #include _x`` lines replaced by ``lua/_x.lua``.

    Redis runs each script alone, so a piece two scripts share (putting a
    lease back in the queue) is pasted into both here rather than written
    twice; ``_``-files are such pieces, never scripts of their own.
    """
    folder = resources.files("scrapy_banker.redis").joinpath("lua")
    texts = {
        entry.name.removesuffix(".lua"): entry.read_text("utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".lua")
    }

    def expand(line: str) -> str:
        if line.startswith("-- #include "):
            return texts[line.removeprefix("-- #include ").strip()]
        return line

    return {
        name: "".join(map(expand, text.splitlines(keepends=True)))
        for name, text in texts.items()
        if not name.startswith("_")
    }


class ScriptRunner:
    """Runs the ``lua/*.lua`` scripts on one client, in batches."""

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        self.client = client
        self._sources = _sources()
        self._shas = {
            name: hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()
            for name, source in self._sources.items()
        }
        self._loaded: set[str] = set()

    def source(self, name: str) -> str:
        """The script as the server runs it (its includes pasted in)."""
        return self._sources[name]

    def sha(self, name: str) -> str:
        """The SHA1 ``EVALSHA`` runs the script by (as ``SCRIPT LOAD`` answers it)."""
        return self._shas[name]

    def run(self, name: str, calls: Sequence[ScriptCall]) -> list[Any]:
        """Each call's reply in order, a :class:`Refusal` in place of a refusal.

        One round trip (two after a lost script); any other error reply is
        raised -- the first in call order, once the whole batch has run.
        """
        return self.run_batch([(name, call) for call in calls])

    def run_batch(self, calls: Sequence[tuple[str, ScriptCall]]) -> list[Any]:
        """:meth:`run` for calls of several scripts, sent in order in one pipeline.

        On one server the commands of a pipeline run in the order sent, which
        is what lets a worker send a callback's children, the version bump and
        the parent's ack in one round trip; a cluster pipeline runs each
        node's share in parallel, so callers that need an order across
        partitions send one batch per step there.
        """
        if not calls:
            return []
        results: list[Any] = [None] * len(calls)
        todo: Sequence[int] = range(len(calls))
        for attempt in range(1, _ATTEMPTS + 1):
            for name in sorted({calls[i][0] for i in todo}):
                if name not in self._loaded or attempt > 1:
                    # On a cluster, SCRIPT LOAD goes to every primary.
                    self.client.script_load(self._sources[name])
                    self._loaded.add(name)
            pipe = self.client.pipeline(transaction=False)
            for i in todo:
                name, call = calls[i]
                pipe.execute_command(
                    "EVALSHA", self._shas[name], len(call.keys), *call.keys, *call.args
                )
            answers = pipe.execute(raise_on_error=False)
            retry: list[int] = []
            for i, answer in zip(todo, answers, strict=True):
                if isinstance(answer, NoScriptError) and attempt < _ATTEMPTS:
                    retry.append(i)
                else:
                    results[i] = answer
            if not retry:
                break
            todo = retry
        return [_refusal(answer) for answer in results]

    def values(self, name: str, calls: Sequence[ScriptCall]) -> list[Any]:
        """:meth:`run` for scripts that never refuse: any refusal is an error too."""
        results = self.run(name, calls)
        for answer in results:
            if isinstance(answer, Refusal):
                raise redis.ResponseError(answer.reply)
        return results


def _refusal(answer: Any) -> Any:
    if not isinstance(answer, Exception):
        return answer
    if isinstance(answer, redis.ResponseError):
        text = str(answer)
        if "NOTOWNER" in text:
            return Fenced(text)
        if text.startswith("BUSY"):
            return Busy(text)
    raise answer
