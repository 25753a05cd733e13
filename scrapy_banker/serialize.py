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

    def decode(self, payload: str | bytes, spider: Spider | None = None) -> Request:
        try:
            raw = json.loads(payload)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedPayload(f"not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise MalformedPayload(f"expected a JSON object, got {type(raw).__name__}")
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
