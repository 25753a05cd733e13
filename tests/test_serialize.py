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

from scrapy_banker.scheduler.serialize import MalformedPayload, RequestCodec, UnserializableRequest


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
        ('{"url": "http://h/", "callback": "__init__"}', "dunder"),
        ('{"url": "http://h/", "callback": "__class__"}', "dunder"),
        ('{"url": "http://h/", "callback": "__reduce__"}', "dunder"),
        ('{"url": "http://h/", "errback": "__getattribute__"}', "dunder"),
        ('{"url": "http://h/", "callback": "crawler.engine.close_spider"}', "single identifier"),
        ('{"url": "http://h/", "callback": "os.system"}', "single identifier"),
        ('{"url": "http://h/", "callback": "builtins:eval"}', "single identifier"),
        ('{"url": "http://h/", "callback": ["parse"]}', "not a method name"),
        ('{"url": "http://h/", "callback": {"name": "parse"}}', "not a method name"),
        ('{"url": "http://h/", "callback": "name"}', "not a method of the spider"),
        ('{"url": "http://h/", "callback": "logger"}', "property"),
        ('{"url": "http://h/", "callback": "from_crawler"}', "classmethod"),
        ('{"url": "http://h/", "callback": "close"}', "staticmethod"),
        ('{"url": "http://h/", "callback": "stored_function"}', "not a method bound"),
        ('{"url": "http://h/", "errback": "missing"}', "missing"),
        ('{"url": "http://h/", "body": {"\\u0000bytes": "%%%"}}', "bad bytes"),
        ('{"url": "not a url"}', "cannot build request"),
    ],
)
def test_malformed_payloads_are_refused(spider: MySpider, payload: str | bytes, match: str) -> None:
    spider.stored_function = lambda response: None  # type: ignore[attr-defined]
    with pytest.raises(MalformedPayload, match=match):
        RequestCodec().decode(payload, spider)


class Trap(Spider):
    """A spider whose attributes run code when read: resolving a name must not read them."""

    name = "trap"
    touched: list[str] = []

    @property
    def armed(self) -> Any:
        self.touched.append("property")
        return self.parse

    def __getattr__(self, name: str) -> Any:
        self.touched.append(name)
        return self.parse


def test_resolving_a_name_runs_no_property_and_no_getattr() -> None:
    trap = Trap()
    Trap.touched.clear()  # Spider.__init__ itself looks for start_urls
    codec = RequestCodec()
    for name in ("armed", "conjured"):
        with pytest.raises(MalformedPayload, match="not a method of the spider"):
            codec.decode(json.dumps({"url": "http://h/", "callback": name}), trap)
    assert Trap.touched == []


class Mixin:
    def parse_from_mixin(self, response: Any) -> None:
        pass


class Layered(Mixin, MySpider):
    name = "layered"

    def __parse_mangled(self, response: Any) -> None:
        pass

    def mangled_request(self) -> Request:
        return Request("http://h/m", callback=self.__parse_mangled)


def test_what_scrapy_resolves_round_trips() -> None:
    """Private, name-mangled and mixin methods: what Scrapy's own JOBDIR persists."""
    spider = Layered()
    codec = RequestCodec()
    for request in (
        Request("http://h/p", callback=spider._private, errback=spider._private),
        Request("http://h/x", callback=spider.parse_from_mixin, errback=spider.on_error),
        spider.mangled_request(),
    ):
        for payload in (codec.encode(request, spider), codec.encode_compact(request, spider)):
            back = codec.decode(payload, spider)
            assert back.callback == request.callback
            assert back.errback == request.errback
    assert json.loads(codec.encode(spider.mangled_request(), spider))["callback"] == (
        "_Layered__parse_mangled"
    )
    # Scrapy's own encoder names the same methods.
    for request in (Request("http://h/", callback=spider._private), spider.mangled_request()):
        assert (
            request.to_dict(spider=spider)["callback"]
            == json.loads(codec.encode(request, spider))["callback"]
        )


def test_scrapy_spider_classes_round_trip() -> None:
    """CrawlSpider's ``_callback``/``_errback`` with ``cb_kwargs``; SitemapSpider's parser."""
    from scrapy.linkextractors import LinkExtractor
    from scrapy.spiders import CrawlSpider, Rule, SitemapSpider

    class Crawl(CrawlSpider):
        name = "crawl"
        rules = (Rule(LinkExtractor(), callback="parse_item", errback="on_error", follow=True),)

        def parse_item(self, response: Any) -> None:
            pass

        def on_error(self, failure: Any) -> None:
            pass

    class Sitemap(SitemapSpider):
        name = "sitemap"
        sitemap_urls = ["http://h/robots.txt"]

    crawl, sitemap = Crawl(), Sitemap()
    codec = RequestCodec()
    rule_request = Request(
        "http://h/a", callback=crawl._callback, errback=crawl._errback, cb_kwargs={"rule_index": 0}
    )
    back = codec.decode(codec.encode_compact(rule_request, crawl), crawl)
    assert (back.callback, back.errback, back.cb_kwargs) == (
        crawl._callback, crawl._errback, {"rule_index": 0},
    )  # fmt: skip
    sm = Request("http://h/sitemap.xml", callback=sitemap._parse_sitemap)
    assert codec.decode(codec.encode(sm, sitemap), sitemap).callback == sitemap._parse_sitemap


# -- delegated callbacks: a method of another object kept as an attribute of the spider ----


class Helper:
    """The object a spider delegates parsing to; reading its attributes is recorded."""

    touched: list[str] = []

    def parse_page(self, response: Any) -> None:
        pass

    def on_error(self, failure: Any) -> None:
        pass

    def __call__(self, response: Any) -> None:
        pass

    @classmethod
    def build(cls, response: Any) -> None:
        pass

    @property
    def parse_lazily(self) -> Any:
        self.touched.append("helper property")
        return self.parse_page

    def __getattr__(self, name: str) -> Any:
        self.touched.append(f"helper __getattr__ {name}")
        return self.parse_page


_STRAY = Helper()


class Delegating(Spider):
    """Scrapy's own ``test_delegated_callback_serialization`` spider, and traps around it."""

    name = "delegating"
    touched: list[str] = []

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.helper = Helper()
        self.parse_page = self.helper.parse_page
        self.on_error = self.helper.on_error
        self.whole_helper = self.helper.__call__  # a dunder one level down
        self.built = Helper.build  # bound to a class
        vars(self)["shadowed"] = self.helper.parse_page  # under the property below

    @property
    def shadowed(self) -> Any:
        self.touched.append("spider property")
        return self.helper.parse_page

    def __getattr__(self, name: str) -> Any:
        self.touched.append(f"spider __getattr__ {name}")
        return _STRAY.parse_page


@pytest.fixture
def delegating() -> Delegating:
    spider = Delegating()
    Delegating.touched.clear()
    Helper.touched.clear()
    return spider


def test_delegated_callback_round_trips(delegating: Delegating) -> None:
    """Scrapy names and resolves ``self.parse_page = helper.parse_page``: so does the codec."""
    codec = RequestCodec()
    request = Request(
        "http://h/d",
        callback=delegating.parse_page,
        errback=delegating.on_error,
        cb_kwargs={"page": 2},
    )
    for payload in (codec.encode(request, delegating), codec.encode_compact(request, delegating)):
        assert codec.payload_dict(payload)["callback"] == "parse_page"
        assert codec.payload_dict(payload)["errback"] == "on_error"
        back = codec.decode(payload, delegating)
        assert back.callback == request.callback
        assert back.callback.__self__ is delegating.helper  # type: ignore[union-attr]
        assert back.errback == request.errback
        assert back.cb_kwargs == {"page": 2}
    assert Delegating.touched == [] and Helper.touched == []
    # Scrapy's own to_dict gives the same name (reading every member: properties run there).
    assert request.to_dict(spider=delegating)["callback"] == "parse_page"


def test_delegated_callback_follows_the_spider_rebinding_it(delegating: Delegating) -> None:
    """The name is looked up at each encode: a method the spider let go of is not persisted."""
    codec = RequestCodec()
    old = delegating.on_error
    assert json.loads(codec.encode(Request("http://h/", callback=old), delegating))["callback"] == (
        "on_error"
    )
    delegating.on_error = Helper().on_error
    with pytest.raises(UnserializableRequest, match="is not an instance method in: <Delegating"):
        codec.encode(Request("http://h/", callback=old), delegating)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("whole_helper", "dunder __call__ of Helper"),  # a dunder one level down
        ("__hook__", "dunder"),  # a dunder attribute of the spider
        ("built", "class method"),
        ("shadowed", "property"),  # a class property beats the instance's attribute: not run
        ("conjured", "missing"),  # only the spider's __getattr__ would make it: not run
        ("helper", "Helper"),  # the object itself, not a method of it
        ("helper.parse_page", "single identifier"),  # no getattr chain
        ("helper.parse_lazily", "single identifier"),
        ("helper.conjured", "single identifier"),
        ("tests.test_serialize.Helper.parse_page", "single identifier"),  # no import path
        ("tests.test_serialize:Helper.parse_page", "single identifier"),
    ],
)
def test_delegated_callbacks_keep_the_safety_rules(
    delegating: Delegating, name: str, match: str
) -> None:
    setattr(delegating, "__hook__", delegating.helper.parse_page)  # noqa: B010
    codec = RequestCodec()
    for key in ("callback", "errback"):
        for payload in (
            json.dumps({"url": "http://h/", key: name}),
            "2" + json.dumps({"u": "http://h/", key[0]: name}),
        ):
            with pytest.raises(MalformedPayload, match=match):
                codec.decode(payload, delegating)
    assert Delegating.touched == [] and Helper.touched == []


def test_what_a_delegated_callback_may_not_be_is_never_persisted(delegating: Delegating) -> None:
    """Encoding refuses what decoding would: nothing is stored that would not come back."""
    codec = RequestCodec()
    helper = delegating.helper
    for callback, match in (
        (delegating.whole_helper, "dunder __call__"),
        (delegating.built, "class method"),
        (Helper().parse_page, "is not an instance method in"),  # an object the spider lacks
    ):
        with pytest.raises(UnserializableRequest, match=match):
            codec.encode(Request("http://h/", callback=callback), delegating)
    # Reached only through helper's __getattr__: the codec does not follow it either.
    with pytest.raises(UnserializableRequest, match="is not an instance method in"):
        codec.encode(Request("http://h/", callback=Helper().conjured), delegating)
    Helper.touched.clear()
    # The same method under a dunder attribute and a plain one: stored by the plain name
    # (Scrapy's to_dict would pick the dunder, the first in alphabetical order).
    setattr(delegating, "__hook__", helper.parse_page)  # noqa: B010
    payload = codec.encode(Request("http://h/", callback=helper.parse_page), delegating)
    assert json.loads(payload)["callback"] == "parse_page"
    assert codec.decode(payload, delegating).callback == helper.parse_page
    # Only under a dunder attribute: refused, saying why.
    del delegating.parse_page
    with pytest.raises(UnserializableRequest, match="dunder"):
        codec.encode(Request("http://h/", callback=helper.parse_page), delegating)
    assert Delegating.touched == [] and Helper.touched == []


def test_what_would_not_resolve_back_is_never_persisted(spider: MySpider) -> None:
    """Encoding applies decoding's rule: a class method, a method of an object the spider
    does not hold, a builtin stay unsaved."""
    other = MySpider()
    codec = RequestCodec()
    for callback in (MySpider.from_crawler, other.parse_item, print):
        with pytest.raises(UnserializableRequest):
            codec.encode(Request("http://h/", callback=callback), spider)
    with pytest.raises(UnserializableRequest, match="meta"):
        codec.encode(Request("http://h/", meta={"callable": lambda: None}), spider)


def test_a_callable_in_a_payload_stays_data(spider: MySpider) -> None:
    """Names in meta, cb_kwargs or headers are strings: nothing resolves them."""
    payload = json.dumps({
        "url": "http://h/",
        "meta": {"callback": "__init__", "f": "os.system"},
        "cb_kwargs": {"x": "__class__"},
    })  # fmt: skip
    back = RequestCodec().decode(payload, spider)
    assert back.meta == {"callback": "__init__", "f": "os.system"}
    assert back.cb_kwargs == {"x": "__class__"}
    assert back.callback is None


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
