"""Requests to and from JSON, without pickle.

Scrapy's JOBDIR queues and scrapy-redis pickle requests; unpickling data that
someone else can write (a Redis shared by a fleet, a job directory on a shared
disk) is remote code execution.  Here a request travels as JSON of
``Request.to_dict()``; on the way back only allow-listed request classes are
built, and a callback or errback resolves the way Scrapy's own
``request_from_dict`` resolves it -- by name, on the running spider -- kept
narrow: the name must be one identifier (no dotted chain, no import path),
not a dunder, and name either a plain function defined on the spider's class
or one of its bases (private ``_callback`` of ``CrawlSpider``, name-mangled
``_Spider__parse`` and mixin methods included), bound to that spider, or a
delegated callback: a method of another object that the spider keeps as an
attribute (``self.parse_page = helper.parse_page``, which Scrapy's
``to_dict`` names too), bound to an instance, not a class, and not a dunder
of its own class.  The lookup is static (:func:`inspect.getattr_static`), so
resolving a name runs no property and no ``__getattr__`` -- of the spider or
of the object a delegated method belongs to.  Encoding checks the same rule,
so a request is never persisted with a callback that would not resolve back.
Bytes (body, headers, bytes in meta) are tagged and base64-encoded.
"""

from __future__ import annotations

import base64
import inspect
import json
import types
import zlib
from collections.abc import Callable, Iterable, Iterator
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
    "method_name",
    "method_name_problem",
    "resolve_method",
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


def method_name_problem(name: object) -> str | None:
    """Why ``name`` can never name a callback (None: it may, if the spider has it).

    Checked without a spider, e.g. when an operator lists dead letters.
    """
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a method name"
    if not name.isidentifier():
        return "is not a single identifier (dotted chains and import paths never resolve)"
    if name.startswith("__") and name.endswith("__"):
        return "is a dunder name (never resolved)"
    return None


def _spider_label(spider: object) -> str:
    """``<MySpider 'name'>``, read statically (no property runs), for error messages."""
    name = inspect.getattr_static(spider, "name", None)
    cls = type(spider).__name__
    return f"<{cls} {name!r}>" if isinstance(name, str) else f"<{cls}>"


def _delegated_problem(method: types.MethodType) -> str | None:
    """Why a method of another object, kept on the spider, is no callback (None: it is)."""
    func = method.__func__
    if not isinstance(func, types.FunctionType):
        return f"is a method wrapping a {type(func).__name__}, not a plain function"
    if isinstance(method.__self__, type):
        return "is a class method (never resolved)"
    if func.__name__.startswith("__") and func.__name__.endswith("__"):
        return f"is the dunder {func.__name__} of {type(method.__self__).__name__} (never resolved)"
    return None


def resolve_method(spider: object, name: object, what: str = "callback") -> Callable[..., Any]:
    """The spider's method called ``name``, as Scrapy's ``request_from_dict`` finds it.

    That is a plain function of the spider's class (or a base class), bound
    to ``spider``, or a delegated callback: a method of another object kept
    under ``name`` on the spider (or its class), returned as it is stored --
    Scrapy's ``to_dict`` names both kinds, and ``request_from_dict`` gets both
    back with ``getattr``.  Raises :class:`MalformedPayload` saying why for
    anything else: properties, class and static methods, attributes,
    functions stored on the instance, a delegated class method or dunder,
    and anything :func:`method_name_problem` refuses.  Nothing is read with
    ``getattr`` before the static lookup has found a plain function on the
    class, so no property, ``__getattr__`` or ``__getattribute__`` runs for a
    delegated callback at all.
    """
    problem = method_name_problem(name)
    if problem is not None:
        raise MalformedPayload(f"{what} {name!r} {problem}")
    assert isinstance(name, str)
    static = inspect.getattr_static(spider, name, None)  # runs no descriptor, no __getattr__
    if isinstance(static, types.MethodType):
        # Bound methods are no descriptors: getattr() would return this very object.
        problem = _delegated_problem(static)
        if problem is not None:
            raise MalformedPayload(
                f"{what} {name!r} of the spider {type(spider).__name__} {problem}"
            )
        return static
    if not isinstance(static, types.FunctionType):
        cls = type(spider).__name__
        if static is None:  # Scrapy's own wording follows, for whoever searches logs for it
            raise MalformedPayload(
                f"{what} {name!r} is not a method of the spider {cls} (missing): "
                f"Method {name!r} not found in: {_spider_label(spider)}"
            )
        raise MalformedPayload(
            f"{what} {name!r} is not a method of the spider {cls} ({type(static).__name__})"
        )
    bound = getattr(spider, name)
    if not (inspect.ismethod(bound) and bound.__self__ is spider):
        raise MalformedPayload(
            f"{what} {name!r} is not a method bound to the spider {type(spider).__name__}"
        )
    return bound  # type: ignore[no-any-return]


def _static_members(spider: object) -> Iterator[tuple[str, object]]:
    """The spider's instance attributes, then its classes' (MRO order), read without getattr."""
    try:
        instance = object.__getattribute__(spider, "__dict__")  # as getattr_static reads it
    except AttributeError:
        instance = {}
    if isinstance(instance, dict):
        yield from list(instance.items())
    for klass in type(spider).__mro__:
        yield from list(vars(klass).items())


def method_name(spider: object, method: Callable[..., Any], cache: dict[Any, str]) -> str:
    """The name :func:`resolve_method` resolves back to ``method`` (encoding's side).

    A method of the spider is named after the class attribute holding its
    function; a method of another object after the spider's attribute
    holding that very bound method (same function, same object), as
    Scrapy's ``to_dict`` finds it.  Raises :class:`UnserializableRequest`
    for what Scrapy's ``to_dict`` cannot name either (a lambda, a method of
    an object the spider does not hold) and for what this codec would refuse
    to resolve (a class or static method, a dunder).  ``cache`` maps the
    spider's own functions to names already found (one per codec);
    delegated callbacks are looked up each time, in the few attributes of
    the instance, since the spider may rebind them.
    """
    func = getattr(method, "__func__", None)
    owner = getattr(method, "__self__", None)
    if func is None or spider is None:
        raise UnserializableRequest(f"Function {method!r} is not an instance method in: {spider!r}")
    if owner is spider:
        name = cache.get(func)
        if name is not None:
            return name
        for klass in type(spider).__mro__:
            for attr, value in vars(klass).items():
                if value is func and inspect.getattr_static(spider, attr, None) is func:
                    try:
                        resolve_method(spider, attr)
                    except MalformedPayload as exc:
                        raise UnserializableRequest(str(exc)) from None
                    cache[func] = attr
                    return attr
    refused: str | None = None
    for attr, value in _static_members(spider):
        if not (
            isinstance(value, types.MethodType)
            and value.__func__ is func
            and value.__self__ is owner
            and inspect.getattr_static(spider, attr, None) is value  # not shadowed
        ):
            continue
        try:
            resolve_method(spider, attr)
        except MalformedPayload as exc:
            refused = refused or str(exc)
            continue
        return attr
    if refused is not None:
        raise UnserializableRequest(refused)
    raise UnserializableRequest(
        f"Function {method!r} is not an instance method in: {spider!r} "
        "(neither a method of the spider's class nor a method the spider keeps as an attribute)"
    )


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
        self._names: dict[Any, str] = {}

    def encode(self, request: Request, spider: Spider | None = None) -> str:
        cls_path = _path(type(request))
        if cls_path not in self.allowed:
            raise UnserializableRequest(
                f"request class {cls_path} is not allow-listed "
                "(add it to BANKER_SERIALIZE_ALLOWED_CLASSES)"
            )
        callback, errback = request.callback, request.errback
        try:
            if callable(callback) or callable(errback):
                # Named here (cached per function) instead of by to_dict's scan
                # of every spider member, with the rule decode() applies.
                d = request.replace(callback=None, errback=None).to_dict()
                for key, func in (("callback", callback), ("errback", errback)):
                    if callable(func):
                        d[key] = method_name(spider, func, self._names)
            else:
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
        methods: dict[str, Callable[..., Any]] = {}
        for name in ("callback", "errback"):
            method = d.pop(name, None)
            if method is None:
                continue
            if spider is None:
                raise MalformedPayload(f"{name} {method!r} needs a spider to resolve")
            methods[name] = resolve_method(spider, method, name)
        try:
            request = request_from_dict(d)
        except (TypeError, ValueError, KeyError) as exc:
            raise MalformedPayload(f"cannot build request: {exc}") from None
        if methods:
            # Set after construction: request_from_dict would getattr() the names again.
            request.callback = methods.get("callback")
            request.errback = methods.get("errback")
        return request
