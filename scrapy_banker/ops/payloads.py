"""A stored request payload as an operator sees it: read with the crawl's codec, never run.

The read models show what a queued, leased or dead-lettered request would
fetch -- a fleet's (:mod:`scrapy_banker.ops.fleet_deadletters`,
:mod:`scrapy_banker.ops.explanation`) and a JOBDIR's
(:mod:`scrapy_banker.ops.jobdir_deadletters`) -- without the spider that
will run it and without pickle.  Both ask the same question, so it is
answered here, once: the payload is read with the project's JSON codec
(:class:`~scrapy_banker.scheduler.serialize.RequestCodec`), its callback and
errback names are set aside (only
:func:`~scrapy_banker.scheduler.serialize.method_name_problem` is asked about
them: whether the spider has the method is known only to the crawl), and
the rest must decode.  What the codec refuses is reported, not raised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from scrapy_banker.scheduler.serialize import MalformedPayload, RequestCodec, method_name_problem

__all__ = ["PayloadInfo", "check_payload", "describe_payload"]


def check_payload(payload: str, codec: RequestCodec) -> tuple[dict[str, Any] | None, str | None]:
    """The payload's JSON object (long keys) and why the codec refuses it (None: it decodes).

    Checked without a spider: callback and errback names are set aside, and
    only names that can never resolve are an error.  Any payload format
    (plain JSON, compact ``2``, compressed ``Z``) is read.
    """
    try:
        raw = codec.payload_dict(payload)
    except MalformedPayload as exc:
        return None, str(exc)
    bare = {k: v for k, v in raw.items() if k not in ("callback", "errback")}
    error: str | None = None
    try:
        codec.decode(json.dumps(bare))
    except MalformedPayload as exc:
        error = str(exc)
    for name in ("callback", "errback"):
        value = raw.get(name)
        problem = None if value is None else method_name_problem(value)
        if problem is not None:
            error = error or f"{name} {value!r} {problem}"
    return raw, error


@dataclass(frozen=True)
class PayloadInfo:
    """What a stored payload says, as far as the JSON codec accepts it."""

    url: str | None
    method: str | None
    callback: str | None
    topic: str | None
    priority: int
    #: Why the codec refuses it (None: a request the crawl can run).
    error: str | None


def describe_payload(payload: str | None, codec: RequestCodec | None = None) -> PayloadInfo:
    """Read a payload with the project's codec, without a spider and without pickle.

    Callbacks are names the running spider resolves; here they are reported,
    not resolved (:func:`check_payload`).
    """
    if payload is None:
        return PayloadInfo(None, None, None, None, 0, "no payload stored")
    raw, error = check_payload(payload, codec or RequestCodec())
    if raw is None:
        return PayloadInfo(None, None, None, None, 0, error)
    callback = raw.get("callback")
    meta = raw.get("meta") if isinstance(raw.get("meta"), dict) else {}
    topic = meta.get("banker_topic") if isinstance(meta, dict) else None
    url = raw.get("url") if isinstance(raw.get("url"), str) else None
    method = raw.get("method") if isinstance(raw.get("method"), str) else None
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        priority = 0
    return PayloadInfo(
        url=url,
        method=method,
        callback=callback if isinstance(callback, str) else None,
        topic=topic if isinstance(topic, str) else None,
        priority=priority,
        error=error,
    )
