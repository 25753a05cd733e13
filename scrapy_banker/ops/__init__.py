"""The operator's view of a running crawl: metrics, progress, the time-series record.

Extensions (enabled by the add-on, each off until its setting is set):

* :class:`scrapy_banker.ops.timeseries.BankerTimeseries` -- one
  :class:`~scrapy_banker.core.telemetry.Sample` per interval, appended to
  ``BANKER_TIMESERIES_FILE``;
* :class:`scrapy_banker.ops.metrics.BankerMetrics` -- ``/metrics`` in the
  Prometheus text format on ``BANKER_METRICS_PORT``;
* :class:`scrapy_banker.ops.progress.BankerProgress` -- a live table on a
  terminal with ``BANKER_PROGRESS``.

This package file imports nothing: :mod:`scrapy_banker.ops.plots` draws
charts from a record without Scrapy, Twisted or Redis.
"""
