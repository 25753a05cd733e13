"""Requests survive JSON; nothing unsafe comes back."""

from __future__ import annotations

import base64
import json
import os
import pickle
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest

from scrapy_banker.serialize import MalformedPayload, RequestCodec, UnserializableRequest


class MySpider(Spider):
    name = "s"

    def parse_item(self, response: Any) -> None:
        pass

    def on_error(self, failure: Any) -> None:
        pass

    def _private(self, response: Any) -> None:
        pass


class CustomRequest(Request):
    pass


@pytest.fixture
def spider() -> MySpider:
    return MySpider()


def test_round_trip_keeps_everything(spider: MySpider) -> None:
    codec = RequestCodec()
    req = Request(
        "http://h.test/a?b=1",
        method="POST",
        body=b"\x00\xffbinary",
        headers={"X-A": "1", "X-B": ["2", "3"]},
        cookies={"c": "v"},
        meta={"banker_topic": "news", "depth": 3, "raw": b"\x01", "nested": {"k": [1, 2.5, None]}},
        cb_kwargs={"page": 7},
        priority=-4,
        dont_filter=True,
        callback=spider.parse_item,
        errback=spider.on_error,
        flags=["f"],
    )
    back = codec.decode(codec.encode(req, spider), spider)
    assert type(back) is Request
    assert (back.url, back.method, back.body, back.priority, back.dont_filter) == (
        req.url, req.method, req.body, req.priority, req.dont_filter,
    )  # fmt: skip
    assert back.headers.getlist("X-B") == [b"2", b"3"]
    assert back.meta == req.meta
    assert back.cb_kwargs == {"page": 7}
    assert back.callback == spider.parse_item
    assert back.errback == spider.on_error
    assert back.flags == ["f"]


def test_subclasses_of_scrapy_are_allowed_by_default(spider: MySpider) -> None:
    codec = RequestCodec()
    for req in (
        FormRequest("http://h.test/", formdata={"a": "b"}),
        JsonRequest("http://h.test/", data={"x": 1}),
    ):
        assert type(codec.decode(codec.encode(req, spider), spider)) is type(req)


def test_custom_class_must_be_allow_listed(spider: MySpider) -> None:
    with pytest.raises(UnserializableRequest, match="not allow-listed"):
        RequestCodec().encode(CustomRequest("http://h.test/"), spider)
    codec = RequestCodec([f"{__name__}.CustomRequest"])
    assert (
        type(codec.decode(codec.encode(CustomRequest("http://h.test/"), spider), spider))
        is CustomRequest
    )
    with pytest.raises(ValueError, match="BANKER_SERIALIZE_ALLOWED_CLASSES"):
        RequestCodec(["json.dumps"])


def test_unserializable_meta_is_reported(spider: MySpider) -> None:
    with pytest.raises(UnserializableRequest, match=r"meta.*set"):
        RequestCodec().encode(Request("http://h.test/", meta={"s": {1, 2}}), spider)


def test_lambda_callback_is_unserializable(spider: MySpider) -> None:
    with pytest.raises(UnserializableRequest):
        RequestCodec().encode(Request("http://h.test/", callback=lambda r: None), spider)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"\x80\x04not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"url": "http://h/", "_class": "os.system"}', "not allow-listed"),
        ('{"url": "http://h/", "_class": "subprocess.Popen"}', "not allow-listed"),
        ('{"method": "GET"}', "url"),
        ('{"url": "http://h/", "callback": "_private"}', "not a public method"),
        ('{"url": "http://h/", "callback": "__init__"}', "not a public method"),
        ('{"url": "http://h/", "callback": "name"}', "not a public method"),
        ('{"url": "http://h/", "errback": "missing"}', "not a public method"),
        ('{"url": "http://h/", "body": {"\\u0000bytes": "%%%"}}', "bad bytes"),
        ('{"url": "not a url"}', "cannot build request"),
    ],
)
def test_malformed_payloads_are_refused(spider: MySpider, payload: str | bytes, match: str) -> None:
    with pytest.raises(MalformedPayload, match=match):
        RequestCodec().decode(payload, spider)


def test_a_pickle_payload_is_never_executed(spider: MySpider, tmp_path: Any) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    evil = pickle.dumps(Exploit())
    codec = RequestCodec()
    for payload in (evil, base64.b64encode(evil)):
        with pytest.raises(MalformedPayload, match="not JSON"):
            codec.decode(payload, spider)
    # Pickle bytes inside a valid payload stay inert data.
    carried = codec.decode(json.dumps({"url": "http://h/", "meta": {"p": evil.hex()}}), spider)
    assert carried.meta["p"] == evil.hex()
    assert not marker.exists()


# -- the compact format of the Redis frontier ----------------------------------------------


def test_compact_payload_round_trips_and_drops_defaults(spider: MySpider) -> None:
    codec = RequestCodec()
    plain = Request("https://a.example/x", callback=spider.parse, meta={"banker_topic": "t"})
    compact = codec.encode_compact(plain, spider)
    assert compact == '2{"u":"https://a.example/x","c":"parse","m":{"banker_topic":"t"}}'
    assert len(compact) < len(codec.encode(plain, spider)) / 3
    back = codec.decode(compact, spider)
    assert (back.url, back.callback, back.meta, back.method) == (
        plain.url, spider.parse, {"banker_topic": "t"}, "GET",
    )  # fmt: skip
    form = FormRequest("https://a.example/f", formdata={"q": "1"}, priority=-2, dont_filter=True)
    again = codec.decode(codec.encode_compact(form, spider), spider)
    assert type(again) is FormRequest
    assert (again.body, again.priority, again.dont_filter, again.method) == (
        b"q=1", -2, True, "POST",
    )  # fmt: skip


def test_large_compact_payloads_are_compressed(spider: MySpider) -> None:
    codec = RequestCodec()
    big = Request("https://a.example/p", method="POST", body=b"a" * 5000, headers={"X": "y"})
    payload = codec.encode_compact(big, spider)
    assert payload.startswith("Z") and len(payload) < 500
    back = codec.decode(payload, spider)
    assert (back.body, back.headers[b"X"], back.method) == (big.body, b"y", "POST")
    assert codec.payload_dict(payload)["method"] == "POST"


def test_formats_across_versions_are_read_or_refused_with_a_reason(spider: MySpider) -> None:
    """A fleet upgrades worker by worker: each side of the version line, in both directions."""
    codec = RequestCodec()
    request = Request("https://a.example/v", callback=spider.parse, priority=4)
    # New worker, old payload (plain JSON of encode(), as every earlier release wrote it).
    assert codec.decode(codec.encode(request, spider), spider).priority == 4
    # Old worker, new payload: its decoder was json.loads, which refuses the marker,
    # so it dead-letters the request with "not JSON" and the payload is kept.
    long = Request("https://a.example/" + "z" * 3000)
    for payload in (codec.encode_compact(request, spider), codec.encode_compact(long, spider)):
        with pytest.raises(ValueError):
            json.loads(payload)
    # New worker, payload of a format newer than itself: refused with the reason.
    with pytest.raises(MalformedPayload, match="known payload format: it starts with '3'"):
        codec.decode('3{"u":"https://a.example/"}', spider)
    with pytest.raises(MalformedPayload, match="bad compressed payload"):
        codec.decode("Z%%%", spider)
    with pytest.raises(MalformedPayload, match="url"):
        codec.decode('2{"c":"parse"}', spider)
