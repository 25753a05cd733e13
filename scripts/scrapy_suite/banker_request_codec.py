"""pytest plugin: run Scrapy's ``tests/test_request_dict.py`` through scrapy-banker's codec.

Loaded with ``-p banker_request_codec --banker-codec-form=plain`` (or
``compact``) by ``scripts/scrapy-suite``.  For each test it replaces
``Request.to_dict`` and ``request_from_dict`` (in ``scrapy.utils.request``
and in the test's module, which imported the name) with a round trip through
:class:`~scrapy_banker.scheduler.serialize.RequestCodec`:

* ``request.to_dict(spider=...)`` encodes the request to the JSON text a
  queue would store (:meth:`~RequestCodec.encode` or
  :meth:`~RequestCodec.encode_compact`) and returns that payload's JSON
  object with the long keys of Scrapy's dict (:meth:`~RequestCodec.payload_dict`),
  so the tests that look at ``d["callback"]`` read what is really stored;
  the payload text travels with the dict;
* ``request_from_dict(d, spider=...)`` decodes that text
  (:meth:`~RequestCodec.decode`), the way a worker reads a queue.

So what Scrapy's tests check -- which callbacks, errbacks, classes, bodies,
headers, meta and ``cb_kwargs`` survive, and which callbacks are refused with
a ``ValueError`` -- is checked against the codec, not Scrapy's own dict
functions.  The test module's own ``Request`` subclasses are allow-listed,
as a project lists its own in ``BANKER_SERIALIZE_ALLOWED_CLASSES``.  At the
end the session fails if no request went through the codec: a file that
passed without it would prove nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import scrapy.utils.request
from scrapy import Request

from scrapy_banker.scheduler.serialize import RequestCodec

_FORMS = ("plain", "compact")
_original_to_dict = Request.to_dict
_round_trips = {"encoded": 0, "decoded": 0}


class _Payload(dict[str, Any]):
    """``to_dict``'s result: the payload's JSON object, and the payload text itself."""

    def __init__(self, codec: RequestCodec, text: str) -> None:
        super().__init__(codec.payload_dict(text))
        self.text = text


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--banker-codec-form",
        choices=_FORMS,
        default="plain",
        help="scrapy-banker payload form the requests round-trip through (default: plain)",
    )


@pytest.fixture(autouse=True)
def _banker_codec_round_trip(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    module = request.module
    own_classes = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, Request)
        and value.__module__ == module.__name__
    ]
    codec = RequestCodec(own_classes)
    compact = request.config.getoption("--banker-codec-form") == "compact"
    inside_codec = False

    def to_dict(self: Request, *, spider: Any = None) -> dict[str, Any]:
        nonlocal inside_codec
        if inside_codec:  # the codec builds its JSON from Scrapy's own to_dict()
            return _original_to_dict(self, spider=spider)
        inside_codec = True
        try:
            text = codec.encode_compact(self, spider) if compact else codec.encode(self, spider)
        finally:
            inside_codec = False
        if compact:
            assert text[:1] in ("2", "Z"), f"not a compact payload: {text!r}"
        _round_trips["encoded"] += 1
        return _Payload(codec, text)

    def request_from_dict(d: dict[str, Any], *, spider: Any = None) -> Request:
        if not isinstance(d, _Payload):
            raise TypeError(f"not a dict made by the patched to_dict(): {d!r}")
        if dict(d) != codec.payload_dict(d.text):
            raise TypeError("the dict was changed after to_dict(): its payload no longer matches")
        result = codec.decode(d.text, spider)
        _round_trips["decoded"] += 1
        return result

    monkeypatch.setattr(Request, "to_dict", to_dict)
    monkeypatch.setattr(scrapy.utils.request, "request_from_dict", request_from_dict)
    if hasattr(module, "request_from_dict"):
        monkeypatch.setattr(module, "request_from_dict", request_from_dict)
    yield


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    form = config.getoption("--banker-codec-form")
    terminalreporter.write_line(
        f"scrapy-banker: RequestCodec ({form}) encoded {_round_trips['encoded']} requests,"
        f" decoded {_round_trips['decoded']}"
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _round_trips["decoded"] == 0 and session.testscollected:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
