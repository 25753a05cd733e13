"""A deterministic local "web farm": many virtual hosts served by one process.

Scheduling components can only be judged against a web whose shape, latency
and failures are known in advance.  The package has five modules:

* :mod:`~scrapy_banker.testing.farm.model` -- :class:`FarmConfig` /
  :class:`FarmModel`, a *pure* description of the farm: which hosts exist,
  which pages they have, what every page contains, which links it carries,
  how long it takes to answer and whether it fails.  Everything is derived
  from ``seed``, so tests can compute the exact set of URLs a perfect crawl
  must fetch (:meth:`FarmModel.expected_urls`) without ever talking to the
  server.
* :mod:`~scrapy_banker.testing.farm.pushback` -- sites that push back, the
  pure part: :class:`RateLimit` (``429`` with ``Retry-After`` in seconds,
  as an HTTP date, or without it), :class:`Burst` (headerless ``503``
  windows), robots.txt ``Crawl-delay`` and :class:`PushbackTracker`, which
  decides at receipt time and counts refusals, Retry-After and
  Crawl-delay violations and robots.txt fetches.  All off by default
  (``FarmConfig.rate_limits``, ``bursts``, ``crawl_delays``,
  :meth:`FarmConfig.with_pushback`).
* :mod:`~scrapy_banker.testing.farm.static` -- :class:`StaticSite`, a
  directory tree served as it is under a virtual host name
  (``FarmConfig.static_sites``).
* :mod:`~scrapy_banker.testing.farm.server` -- :class:`FarmServer` /
  :class:`FarmProtocol`, a lean HTTP/1.1 server on a Twisted reactor that
  dispatches on the ``Host`` header, injects delays with ``callLater``
  (never by sleeping) and keeps the bookkeeping counters (per host requests,
  maximum in-flight requests per host, per crawler node) that politeness and
  network-awareness tests need; the child process's entry point.
* :mod:`~scrapy_banker.testing.farm.launcher` -- :class:`WebFarm`, which
  runs the server in a child process
  (``python -m scrapy_banker.testing.farm.server``) so crawls under test
  never share a reactor or a GIL with the site they crawl.

Run ``python -m scrapy_banker.testing.farm.server --config-json '{"hosts": 5}'``
to serve a farm by hand; it prints ``LISTENING <port>`` once it accepts
connections.

The server's names (:class:`FarmServer`, :class:`FarmProtocol`,
:class:`FarmFactory`, :func:`main`) are imported on first use: the model
and the launcher need no Twisted, and ``python -m ...farm.server`` must not
find its own module already imported by the package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from scrapy_banker.testing.farm.launcher import WebFarm
from scrapy_banker.testing.farm.model import (
    NODE_HEADER,
    STATS_PREFIX,
    FarmConfig,
    FarmModel,
    Fault,
    load_rtt_matrix,
)
from scrapy_banker.testing.farm.pushback import (
    Burst,
    HostPushback,
    PushbackTracker,
    RateLimit,
    Refusal,
)
from scrapy_banker.testing.farm.static import StaticSite

if TYPE_CHECKING:
    from scrapy_banker.testing.farm.server import FarmFactory, FarmProtocol, FarmServer, main

__all__ = [
    "NODE_HEADER",
    "STATS_PREFIX",
    "Burst",
    "FarmConfig",
    "FarmFactory",
    "FarmModel",
    "FarmProtocol",
    "FarmServer",
    "Fault",
    "HostPushback",
    "PushbackTracker",
    "RateLimit",
    "Refusal",
    "StaticSite",
    "WebFarm",
    "load_rtt_matrix",
    "main",
]

_SERVER_NAMES = frozenset({"FarmFactory", "FarmProtocol", "FarmServer", "main"})


def __getattr__(name: str) -> Any:
    if name in _SERVER_NAMES:
        server = importlib.import_module("scrapy_banker.testing.farm.server")
        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
