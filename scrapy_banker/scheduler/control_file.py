"""Run-time control of a single process through its JOBDIR: one file the crawl polls.

A fleet's control document lives in Redis (:mod:`scrapy_banker.redis.frontier.control_channel`).
A single process with ``JOBDIR`` gets the same directives through
``JOBDIR/banker/control.json``: ``scrapy banker pause HOST --jobdir DIR``
(and the other actions) rewrites it atomically (a new file renamed over the
old one, under the lock ``banker/control.lock`` so two operators' actions
both land) and appends a line to ``banker/control-log.jsonl`` (who, when,
what); the running crawl looks at the file's modification stamp once a
second and applies a new version (:meth:`ControlFile.poll`).  Nothing is
served over the network and nothing needs a token: whoever may write the
JOBDIR may already change the crawl.

The same :class:`~scrapy_banker.core.directives.ControlState` JSON as a fleet's;
a malformed file is logged once and ignored (the crawl keeps following the
last valid one).  ``purge`` and ``inject`` have no meaning here -- the
queue is the crawl process's own memory -- and are refused by the command.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import TYPE_CHECKING

from scrapy_banker.core.directives import JOBDIR, Action, ControlError, ControlState, get_verb
from scrapy_banker.core.files import fsync_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["CONTROL_FILE", "CONTROL_LOG", "POLL_S", "ControlFile"]

#: The directives, under ``JOBDIR/banker/``.
CONTROL_FILE = "control.json"
#: One JSON line per action, under ``JOBDIR/banker/``.
CONTROL_LOG = "control-log.jsonl"
#: How often the crawl looks at the file (s).
POLL_S = 1.0


class ControlFile:
    """``JOBDIR/banker/control.json``: written by the commands, polled by the crawl."""

    def __init__(self, jobdir: str) -> None:
        self.folder = os.path.join(jobdir, "banker")
        self.path = os.path.join(self.folder, CONTROL_FILE)
        self.log_path = os.path.join(self.folder, CONTROL_LOG)
        self._stamp: tuple[int, int, int] | None = None
        self._bad_logged = False
        #: Reads of a file that is not a valid control document.
        self.malformed = 0

    # -- the crawl --------------------------------------------------------------------

    def poll(self) -> ControlState | None:
        """The directives if the file changed since the last poll (None: unchanged or absent)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        # Every write is a new file renamed over the old one: a new inode even
        # when the size and the time stamp (coarse on some file systems) are the same.
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            state = self.load()
        except (OSError, ControlError) as exc:
            self.malformed += 1
            if not self._bad_logged:
                self._bad_logged = True
                logger.error("Ignoring %s: %s", self.path, exc)
            return None
        self._bad_logged = False
        return state

    def load(self) -> ControlState:
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return ControlState()
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ControlError(f"the control file is not JSON: {exc}") from None
        return ControlState.from_json(data)

    # -- the commands ---------------------------------------------------------------------

    def act(self, action: Action, *, who: str, now: float) -> ControlState:
        """Apply ``action`` to the file (atomically, under its lock) and log it."""
        get_verb(action.verb, JOBDIR)  # the verbs a JOBDIR cannot carry out are refused
        os.makedirs(self.folder, exist_ok=True)
        with self._locked():
            state = self.load().apply(action)
            tmp = self.path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(state.to_json(), f, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            fsync_dir(self.folder)
            entry = {"at": now, "who": who, "version": state.version, **action.to_json()}
            with open(self.log_path, "a", encoding="utf-8") as log:
                log.write(json.dumps(entry, sort_keys=True) + "\n")
        logger.info("Control: %s by %s (version %d)", action.describe(), who, state.version)
        return state

    def log(self, limit: int = 50) -> list[dict[str, Any]]:
        """The latest actions, newest first."""
        try:
            with open(self.log_path, encoding="utf-8") as f:
                lines = f.readlines()
        except FileNotFoundError:
            return []
        out: list[dict[str, Any]] = []
        for line in reversed(lines[-limit:] if limit else []):
            try:
                entry = json.loads(line)
            except ValueError:
                entry = None
            out.append(entry if isinstance(entry, dict) else {"unreadable": line.strip()})
        return out

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(os.path.join(self.folder, "control.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
