"""Every ``request.meta`` key scrapy-banker reads or writes.

``meta`` is the seam between the spider, the middlewares and the scheduler:
the only place a value can ride along with a request through Scrapy's engine,
retries and redirects included.  A key that lives in one module is easy to
misspell in another, and whether it may be copied to a retry, written to
Redis or ``JOBDIR``, or set by a user is a contract that has to be stated
somewhere -- here, and for users in ``docs/reference/meta.rst``.

Each key says who sets it, who reads it, its type, whether it is
*user-facing* (a spider may set it) or *internal* (written by scrapy-banker,
read-only for anyone else), and whether it *travels*: kept when the request
is copied (retry, redirect) or serialized (the Redis frontier, ``JOBDIR``),
or *transient*: a value that only means something for one delivery in this
process and is dropped or overwritten before it could be misread elsewhere.

Pure: this module imports nothing from Scrapy, Twisted or Redis, so the
pure cores and tools can name the keys (``tests/test_layers.py`` checks).
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "ALL_KEYS",
    "INTERNAL_KEYS",
    "META_CHARGED",
    "META_FINISH",
    "META_GRANT",
    "META_HOLD",
    "META_LEASE",
    "META_MAX",
    "META_NEED",
    "META_NET_T0",
    "META_PROBE",
    "META_RECRAWL",
    "META_REVISIT",
    "META_REVISIT_STATE",
    "META_SLOT",
    "META_TASK",
    "META_TOPIC",
    "TRANSIENT_KEYS",
    "USER_KEYS",
    "existing_meta",
]

# -- user-facing: a spider may set these ------------------------------------------------

#: The request's topic (``str``: 1-64 letters, digits, ``_``, ``.``, ``-``).
#: Set by the user to bypass ``BANKER_TOPIC_RULES``; otherwise written by
#: :func:`scrapy_banker.scheduler.topic.request_topic` (called by
#: ``BankerTopicMiddleware``, ``BankerDownloaderMiddleware`` and the scheduler)
#: the first time the request is classified.  Read by the same function; an
#: invalid value is ignored with a warning.  User-facing; travels, so a request
#: read back from Redis or ``JOBDIR`` keeps the topic it was queued under.
META_TOPIC: Final = "banker_topic"

#: Resources the request acquires when the scheduler dispatches it
#: (``dict[str, int]``, names from ``BANKER_RESOURCES``).  Set by the user;
#: read by :class:`~scrapy_banker.scheduler.admission.Admission` (``needs_admission``,
#: ``fitting``, ``try_admit``).  User-facing; travels: a retry or a redelivery
#: needs the same resources again.
META_NEED: Final = "banker_need"

#: The task (``str`` or ``int``) the request belongs to: the Banker's
#: "process" whose resources outlive one request.  Set by the user; read by
#: ``Admission.try_admit``.  User-facing; travels.
META_TASK: Final = "banker_task"

#: The task's maximum claim (``dict[str, int]``), read from the task's first
#: request; defaults to ``BANKER_TASK_CLAIMS[topic]``.  Set by the user; read
#: by ``Admission.try_admit``.  User-facing; travels.
META_MAX: Final = "banker_max"

#: ``bool``: the task keeps what this request acquired after the request ends,
#: until the task finishes.  Set by the user; read by ``Admission.try_admit``.
#: User-facing; travels.
META_HOLD: Final = "banker_hold"

#: ``bool``: the task finishes when this request ends, releasing everything it
#: holds.  Set by the user; read by ``Admission.try_admit``.  User-facing;
#: travels.
META_FINISH: Final = "banker_finish"

# -- internal: written by scrapy-banker, read-only for everyone else -------------------

#: Admission grant token (``int``).  Set by ``Admission.try_admit`` when it
#: grants the request's need; read by ``BankerDownloaderMiddleware`` (to know a
#: release is due) and ``Admission.release_request``, which deletes it.
#: Internal; transient: the token means something only to this process's
#: ``Admission``, and it is deleted on release -- before a retry or redirect
#: copies meta -- so a copy never releases the original's grant.
META_GRANT: Final = "banker_grant"

#: When a revisit was sent (``float``, wall clock): a request sent again because
#: its page came due.  Set by :class:`~scrapy_banker.middlewares.RecrawlMiddleware`'s
#: due loop; read by the same middleware, which sends the page's validators
#: only with a revisit (a page the spider requests again itself is fetched as
#: it asked) and drops a revisit whose page was fetched after it was sent.
#: Internal; travels (a retried revisit is still one, and a JOBDIR keeps it
#: with a queued revisit).
META_REVISIT: Final = "banker_revisit"

#: The page's revisit state (``dict``, :meth:`UrlState.to_json
#: <scrapy_banker.core.recrawl.UrlState.to_json>`) a revisit carries on a
#: fleet: the worker that fetches it -- maybe not the one that sent it --
#: judges the response against it without a Redis read.  Set by
#: :class:`~scrapy_banker.middlewares.RecrawlMiddleware`'s due loop on a fleet
#: only.  Internal; travels (through Redis, with the revisit).
META_REVISIT_STATE: Final = "banker_revisit_state"

#: Download slot (``str``) the scheduler counted the request against when it
#: handed it to the engine.  Set by ``BankerScheduler`` at dispatch (its
#: downloader view, :mod:`scrapy_banker.scheduler.downloader`); set to ``None``
#: there when the request ends (response, exception, left the downloader,
#: dropped), which also marks a request this scheduler did not hand out as
#: ended; read by ``BankerDownloaderMiddleware`` (to know a release is due) and
#: the Redis request store (acknowledging leases without the engine's view).
#: Internal; transient: the Redis store strips it at enqueue, since a copy is
#: a new request that has not been counted.
META_SLOT: Final = "banker_slot"

#: Redis lease of a request popped from the distributed frontier: a
#: :class:`scrapy_banker.core.ops.LeaseToken` (partition, lease id,
#: delivery number).  Set by the Redis request store
#: (:class:`~scrapy_banker.redis.store.RedisLeaseStore`, behind
#: ``BankerRedisScheduler``) when it decodes the request; read by it to
#: acknowledge the lease once the engine is done, or give it back.  The
#: delivery number makes the ack of a slow holder whose lease expired (and
#: went to another node) a no-op; a value of any other type is ignored.
#: Internal; transient: an object, never serialized, and stripped at enqueue,
#: so a retry or redirect is queued as a new request and never acks the
#: original's lease.
META_LEASE: Final = "banker_lease"

#: Site (``str``, a netloc) a GNP probe request measures.  Set by
#: :class:`~scrapy_banker.scheduler.netaware.Prober` on the probes it sends straight to
#: the downloader; read by ``NetworkMeasureMiddleware`` to count probe
#: responses.  Internal (other middlewares may read it to recognise probes);
#: transient: probes never enter a frontier, so it is never serialized.
META_PROBE: Final = "banker_probe"

#: ``time.monotonic()`` (``float``) when the request entered
#: ``NetworkMeasureMiddleware``: the start of the bandwidth measurement.  Set
#: and read by that middleware only.  Internal; transient: a monotonic clock
#: means nothing in another process, and every download attempt overwrites it
#: before the response reads it.
META_NET_T0: Final = "banker_net_t0"

#: ``(host, topic)`` a request was charged to on one node's budgets
#: (:class:`~scrapy_banker.scheduler.control_gate.ControlGate`), set when it leaves
#: for the downloader.  Read (and deleted) by ``BankerScheduler`` when the
#: request is scheduled again -- put back by pushback or a pause, retried, or
#: redirected with its meta -- which gives the page back: a page is charged
#: once, when its last copy leaves.  Internal; transient: a fleet charges in
#: Redis, with the lease.
META_CHARGED: Final = "banker_charged"

#: Whether the page this request fetches is revisited when ``BANKER_RECRAWL``
#: is on (``bool``, default ``True``; ``False`` keeps it out).  Set by the
#: user; read by :class:`~scrapy_banker.middlewares.RecrawlMiddleware`.
#: User-facing; travels, so a retry or a redirect keeps the choice.
META_RECRAWL: Final = "banker_recrawl"

#: Keys a spider may set.
USER_KEYS: Final = (
    META_TOPIC, META_NEED, META_TASK, META_MAX, META_HOLD, META_FINISH, META_RECRAWL
)  # fmt: skip
#: Keys only scrapy-banker writes.
INTERNAL_KEYS: Final = (
    META_GRANT, META_SLOT, META_LEASE, META_PROBE, META_NET_T0, META_CHARGED, META_REVISIT,
    META_REVISIT_STATE,
)  # fmt: skip
#: Process-local values: meaningless to another worker, after a restart or on
#: a copy of the request.  Every other key travels.
TRANSIENT_KEYS: Final = (
    META_GRANT, META_SLOT, META_LEASE, META_PROBE, META_NET_T0, META_CHARGED
)  # fmt: skip
#: Every key, user-facing first.
ALL_KEYS: Final = USER_KEYS + INTERNAL_KEYS


def existing_meta(request: Any) -> dict[str, Any] | None:
    """A request's meta dict if it has one, without creating it.

    ``Request.meta`` creates an empty dict on first access; on the hot paths
    that see every link a spider yields (dedup, drops) most requests have
    none, and creating one each time is wasted work.
    """
    if hasattr(request, "_meta"):
        meta: dict[str, Any] | None = request._meta
        return meta
    found: dict[str, Any] = request.meta
    return found
