"""Requests to and from JSON, without pickle.

Scrapy's JOBDIR queues and scrapy-redis pickle requests; unpickling data that
someone else can write (a Redis shared by a fleet, a job directory on a shared
disk) is remote code execution.  Here a request travels as JSON of
``Request.to_dict()``; on the way back only allow-listed request classes are
built and callbacks resolve only to public methods of the running spider.
Bytes (body, headers, bytes in meta) are tagged and base64-encoded.
"""

from __future__ import annotations

import base64
import inspect
import json
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from scrapy.http import FormRequest, JsonRequest, Request, XmlRpcRequest
from scrapy.utils.misc import load_object
from scrapy.utils.request import request_from_dict

if TYPE_CHECKING:
    from scrapy import Spider

__all__ = [
    "DEFAULT_ALLOWED_CLASSES",
    "MalformedPayload",
    "RequestCodec",
    "UnserializableRequest",
]

_BYTES_TAG = "\u0000bytes"

DEFAULT_ALLOWED_CLASSES: tuple[type[Request], ...] = (
    Request,
    FormRequest,
    JsonRequest,
    XmlRpcRequest,
)


class UnserializableRequest(ValueError):
    """The request holds something JSON cannot carry (a callable in meta, a set...)."""


class MalformedPayload(ValueError):
    """A stored payload is not a request this codec is willing to build."""


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _encode(value: Any, where: str) -> Any:
    if isinstance(value, bytes):
        return {_BYTES_TAG: base64.b64encode(value).decode("ascii")}
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [_encode(v, where) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if isinstance(k, bytes):
                k = k.decode("latin-1")
            if not isinstance(k, str):
                raise UnserializableRequest(f"{where}: dict key {k!r} is not a string")
            out[k] = _encode(v, f"{where}[{k!r}]")
        return out
    raise UnserializableRequest(
        f"{where}: {type(value).__name__} value {value!r} is not JSON-serializable"
    )


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and _BYTES_TAG in value:
            return base64.b64decode(value[_BYTES_TAG], validate=True)
        return {k: _decode(v) for k, v in value.items()}
    return value


#: Compact payloads (:meth:`RequestCodec.encode_compact`) start with a format
#: marker: ``2`` JSON with short keys and no default fields, ``Z`` that
#: zlib-compressed and base64-encoded.  A v1 payload is plain JSON (``{``).
#: A worker older than the marker fails to parse it as JSON and dead-letters
#: it with the reason -- the payload is kept, nothing is lost.
COMPACT = "2"
COMPRESSED = "Z"
#: Compact payloads longer than this are compressed, if that makes them shorter.
COMPRESS_ABOVE = 1024
_SHORT = {
    "url": "u", "callback": "c", "errback": "e", "headers": "h", "body": "b",
    "cookies": "k", "meta": "m", "encoding": "n", "flags": "f", "cb_kwargs": "a",
    "dont_filter": "d", "method": "x", "priority": "p", "_class": "t",
}  # fmt: skip
_LONG = {v: k for k, v in _SHORT.items()}
_DEFAULTS: dict[str, Any] = {
    "callback": None, "errback": None, "headers": {}, "body": b"", "cookies": {}, "meta": {},
    "encoding": "utf-8", "flags": [], "cb_kwargs": {}, "dont_filter": False, "method": "GET",
    "priority": 0, "_class": "scrapy.http.request.Request",
}  # fmt: skip


class RequestCodec:
    """Encode requests for one spider; decode only what that spider could have made."""

    def __init__(self, allowed_classes: Iterable[type[Request] | str] = ()) -> None:
        classes: dict[str, type[Request]] = {_path(c): c for c in DEFAULT_ALLOWED_CLASSES}
        for cls in allowed_classes:
            loaded = load_object(cls) if isinstance(cls, str) else cls
            if not (isinstance(loaded, type) and issubclass(loaded, Request)):
                raise ValueError(
                    f"Invalid BANKER_SERIALIZE_ALLOWED_CLASSES entry {cls!r}: "
                    "expected a scrapy.Request subclass or its import path"
                )
            classes[_path(loaded)] = loaded
        self.allowed = classes

    def encode(self, request: Request, spider: Spider | None = None) -> str:
        cls_path = _path(type(request))
        if cls_path not in self.allowed:
            raise UnserializableRequest(
                f"request class {cls_path} is not allow-listed "
                "(add it to BANKER_SERIALIZE_ALLOWED_CLASSES)"
            )
        try:
            d = request.to_dict(spider=spider)
        except ValueError as exc:  # e.g. a callback that is not a spider method
            raise UnserializableRequest(str(exc)) from exc
        d["_class"] = cls_path
        return json.dumps(_encode(d, "request"), separators=(",", ":"))

    def encode_compact(self, request: Request, spider: Spider | None = None) -> str:
        """:meth:`encode` for a shared frontier where every byte is paid per queued request.

        Fields at their default are left out (a plain GET with a callback and
        a topic is ~90 bytes instead of ~300), keys are one letter, the
        format marker ``2`` leads, and a payload above
        :data:`COMPRESS_ABOVE` bytes is zlib-compressed when that pays.
        :meth:`decode` reads this and the plain JSON of :meth:`encode`.
        """
        d = json.loads(self.encode(request, spider))
        if any(k in _LONG for k in d):  # a subclass attribute named like a short key
            return json.dumps(d, separators=(",", ":"))
        defaults = _encode(_DEFAULTS, "defaults")
        compact = {_SHORT.get(k, k): v for k, v in d.items() if defaults.get(k, d) != v}
        text = COMPACT + json.dumps(compact, separators=(",", ":"))
        if len(text) > COMPRESS_ABOVE:
            packed = COMPRESSED + base64.b64encode(zlib.compress(text.encode("utf-8"))).decode()
            if len(packed) < len(text):
                return packed
        return text

    def payload_dict(self, payload: str | bytes) -> dict[str, Any]:
        """The JSON object of a payload of any format, with the long keys of ``to_dict``.

        Raises :class:`MalformedPayload` for what is no payload (not JSON, an
        unknown format marker, a broken compression).
        """
        text = payload.decode("utf-8", errors="replace") if isinstance(payload, bytes) else payload
        head = text[:1]
        if head == COMPRESSED:
            try:
                text = zlib.decompress(base64.b64decode(text[1:], validate=True)).decode("utf-8")
            except (ValueError, zlib.error) as exc:
                raise MalformedPayload(f"bad compressed payload: {exc}") from None
            head = text[:1]
            if head != COMPACT:
                raise MalformedPayload("compressed payload of unknown format")
        if head == COMPACT:
            text = text[1:]
        elif head.isalnum():
            raise MalformedPayload(
                f"not JSON nor a known payload format: it starts with {head!r} "
                "(written by a newer scrapy-banker?)"
            )
        try:
            raw = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedPayload(f"not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise MalformedPayload(f"expected a JSON object, got {type(raw).__name__}")
        if head == COMPACT:
            raw = {_LONG.get(k, k): v for k, v in raw.items()}
            if not isinstance(raw.get("url"), str):
                raise MalformedPayload("missing or non-string 'url'")
        return raw

    def decode(self, payload: str | bytes, spider: Spider | None = None) -> Request:
        raw = self.payload_dict(payload)
        try:
            d = _decode(raw)
        except (ValueError, TypeError) as exc:
            raise MalformedPayload(f"bad bytes encoding: {exc}") from None
        cls_path = d.get("_class", _path(Request))
        if cls_path not in self.allowed:
            raise MalformedPayload(f"request class {cls_path!r} is not allow-listed")
        if not isinstance(d.get("url"), str):
            raise MalformedPayload("missing or non-string 'url'")
        for name in ("callback", "errback"):
            method = d.get(name)
            if method is None:
                continue
            if spider is None:
                raise MalformedPayload(f"{name} {method!r} needs a spider to resolve")
            if (
                not isinstance(method, str)
                or not method.isidentifier()
                or method.startswith("_")
                or not inspect.ismethod(getattr(spider, method, None))
            ):
                raise MalformedPayload(f"{name} {method!r} is not a public method of the spider")
        try:
            return request_from_dict(d, spider=spider)
        except (TypeError, ValueError, KeyError) as exc:
            raise MalformedPayload(f"cannot build request: {exc}") from None
