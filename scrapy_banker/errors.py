"""Errors that stop a crawl at start-up, told in one line instead of a traceback.

A bad ``BANKER_*`` setting, a JOBDIR another crawl holds or one this version
cannot resume: each is raised with a message that says all a person needs
(what is wrong, the value, what is allowed or what to do).  Scrapy does not
catch what an add-on or a scheduler raises while a crawl starts: it ends as
an unhandled error that the event loop logs with its traceback -- asyncio's
"Task exception was never retrieved" (Scrapy >= 2.14's ``AsyncCrawlerProcess``)
or Twisted's "Unhandled error in Deferred" (``CrawlerProcess``: Scrapy 2.13,
or a reactor other than asyncio's) -- where the message is the last line of
dozens, or nothing at all with ``--nolog``.  ``scrapy crawl`` exits with
status 1 either way.

Importing this module (the settings, the add-on and the JOBDIR lock all do)
installs :class:`StartupErrorFilter` on the loggers those reports reach.  A
record whose exception is one of these errors, or was raised while handling
one (Scrapy's engine, closing a crawl that never opened, chains its own
errors to it), becomes one ``ERROR`` line of this module's logger, its
traceback a ``DEBUG`` record; when no handler would show that line
(``--nolog`` leaves only a ``NullHandler``, ``LOG_LEVEL=CRITICAL``) it is
written to stderr.  Twisted also prints an unhandled error to stderr itself
until logging is "begun", which Scrapy never does: that copy is skipped too.

Exceptions that are handled -- the command that refuses to requeue beside a
crawl, a test that expects ``ValueError`` -- never reach a logger and see
none of this.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from types import FrameType

__all__ = [
    "BankerConfigError",
    "BankerError",
    "StartupErrorFilter",
    "install",
    "startup_error",
    "tell",
]

logger = logging.getLogger(__name__)


class BankerError(Exception):
    """An error whose message is complete: reported as one line when it stops a crawl."""


class BankerConfigError(BankerError, ValueError):
    """A bad ``BANKER_*`` setting; the message names it, its value and what is allowed.

    A ``ValueError``, as the settings' errors always were.
    """


#: Errors of other modules reported the same way, by qualified name (this
#: module imports nothing): a snapshot of another version is a JOBDIR this
#: crawl cannot resume.
_ALSO_REPORTED = frozenset({"scrapy_banker.core.journal.UnsupportedSnapshot"})
#: Where an unhandled start-up error is logged: asyncio's and Twisted's
#: unhandled-error reports; Scrapy's engine and signals, which log the errors
#: of closing a crawl whose start failed (chained to the start-up error).
LOGGERS = ("asyncio", "twisted", "scrapy.core.engine", "scrapy.utils.signal")
#: What Twisted logs, as a message of its own, before an unhandled Deferred's failure.
_DEFERRED_HEADER = "Unhandled error in Deferred:"
_MAX_CHAIN = 32


def _reported_type(exc: BaseException) -> bool:
    if isinstance(exc, BankerError):
        return True
    return any(f"{c.__module__}.{c.__qualname__}" in _ALSO_REPORTED for c in type(exc).__mro__)


def startup_error(exc: BaseException | None) -> BaseException | None:
    """The error of this kind in ``exc``'s chain (itself, its cause, its context...), if any."""
    for _ in range(_MAX_CHAIN):
        if exc is None:
            return None
        if _reported_type(exc):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _deferred_error() -> BaseException | None:
    """The error of the unhandled Deferred whose header Twisted is logging, if any.

    Twisted logs ``Unhandled error in Deferred:`` from ``DebugInfo.__del__``
    before, and apart from, the failure: it is that frame's ``failResult``.
    """
    frame: FrameType | None = sys._getframe(1)
    for _ in range(64):
        if frame is None:
            return None
        if frame.f_code.co_name == "__del__":
            failure = getattr(frame.f_locals.get("self"), "failResult", None)
            value = getattr(failure, "value", None)
            if isinstance(value, BaseException):
                return value
        frame = frame.f_back
    return None


#: Errors already told (the same one can reach several loggers): a strong
#: reference keeps an ``id`` from being reused; start-up errors are few.
_told: deque[BaseException] = deque(maxlen=16)


def _shown(log: logging.Logger, level: int) -> bool:
    """Whether a record of ``level`` on ``log`` reaches a handler that shows it somewhere."""
    if not log.isEnabledFor(level):
        return False
    counter = getattr(sys.modules.get("scrapy.utils.log"), "LogCounterHandler", None)
    silent: tuple[type[logging.Handler], ...] = (logging.NullHandler,)
    if isinstance(counter, type) and issubclass(counter, logging.Handler):
        silent += (counter,)  # Scrapy's log_count/* stats
    current: logging.Logger | None = log
    handlers = 0
    while current is not None:
        for handler in current.handlers:
            handlers += 1
            if not isinstance(handler, silent) and level >= handler.level:
                return True
        current = current.parent if current.propagate else None
    last = logging.lastResort
    return not handlers and last is not None and level >= last.level


def tell(exc: BaseException, exc_info: Any = None, reported: str = "") -> None:
    """Report ``exc`` as one ``ERROR`` line (on stderr if no handler shows it), once.

    ``exc_info`` (by default ``exc``'s own traceback) is logged at ``DEBUG``
    each time, with ``reported``: what the record it replaces said.
    """
    if not any(told is exc for told in _told):
        _told.append(exc)
        line = f"Cannot start the crawl: {exc}"
        logger.error(line)
        if not _shown(logger, logging.ERROR):
            sys.stderr.write(f"{line}\n")
            sys.stderr.flush()
    traceback = exc_info or (type(exc), exc, exc.__traceback__)
    logger.debug("Traceback of the error above%s", f" ({reported})" if reported else "",
                 exc_info=traceback)  # fmt: skip


class StartupErrorFilter(logging.Filter):
    """Turns an unhandled start-up error's traceback into :func:`tell`'s one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        if info is not None and info[1] is not None:
            exc = startup_error(info[1])
            if exc is None:
                return True
            tell(exc, info, f"logged by {record.name} as: {record.getMessage()}")
            return False
        if record.name == "twisted" and str(record.msg) == _DEFERRED_HEADER:
            return startup_error(_deferred_error()) is None
        return True


class _QuietTwistedPrinter:
    """Twisted's stderr printer of critical events, minus the start-up errors told here."""

    def __init__(self, printer: Callable[[Mapping[str, Any]], None]) -> None:
        self.printer = printer

    def __call__(self, event: Mapping[str, Any]) -> None:
        failure = event.get("log_failure")
        if failure is not None:
            error = getattr(failure, "value", None)
        elif event.get("log_format") == _DEFERRED_HEADER:
            error = _deferred_error()
        else:
            error = None
        if not isinstance(error, BaseException) or startup_error(error) is None:
            self.printer(event)


def _quiet_twisted_printer() -> None:
    """Wrap the observer through which Twisted prints critical events to stderr.

    Until ``globalLogBeginner.beginLoggingTo()`` -- which Scrapy never calls --
    Twisted writes every critical event (an unhandled Deferred's failure)
    to stderr, besides the ``twisted`` logger Scrapy routes it to.  That
    observer is private: if it is not there as expected, nothing changes.
    """
    if "twisted.logger" not in sys.modules:
        return  # not in a Twisted process (yet): its own printer is not ours to add
    try:
        from twisted.logger import ILogObserver, globalLogBeginner, globalLogPublisher

        printer = getattr(globalLogBeginner, "_temporaryObserver", None)
        if printer is None or isinstance(printer, _QuietTwistedPrinter):
            return
        quiet = cast("ILogObserver", _QuietTwistedPrinter(printer))
        globalLogPublisher.removeObserver(printer)
        globalLogPublisher.addObserver(quiet)
        globalLogBeginner._temporaryObserver = quiet
    except Exception:  # a cosmetic change never stops a crawl
        logger.debug("Cannot quiet Twisted's stderr printer", exc_info=True)


def install() -> None:
    """:class:`StartupErrorFilter` on each of :data:`LOGGERS` (once); Twisted's printer quieted."""
    for name in LOGGERS:
        log = logging.getLogger(name)
        if not any(isinstance(f, StartupErrorFilter) for f in log.filters):
            log.addFilter(StartupErrorFilter())
    _quiet_twisted_printer()


install()
