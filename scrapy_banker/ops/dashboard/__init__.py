"""The live fleet dashboard: a small Twisted web server and one page.

``scrapy banker dashboard`` (:mod:`scrapy_banker.ops.commands.dashboard`) starts
it.  The server reads the fleet through the same read model as ``scrapy
banker status`` (:mod:`scrapy_banker.ops.fleet_view`), once per refresh
interval on a thread, whatever the number of open tabs, and serves the page
(``static/``, shipped in the package: nothing is fetched from the internet)
and a JSON API.  It binds to 127.0.0.1 unless told otherwise and changes
nothing without ``BANKER_DASHBOARD_TOKEN``.
"""

from __future__ import annotations

__all__: list[str] = []
