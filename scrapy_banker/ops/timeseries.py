"""``BankerTimeseries``: the crawl's time-series record, one sample per interval.

With :setting:`BANKER_TIMESERIES_FILE` set, every
:setting:`BANKER_TIMESERIES_INTERVAL` seconds the scheduler's
:meth:`~scrapy_banker.scheduler.BankerScheduler.sample` is appended to the
file as one JSON line (:func:`~scrapy_banker.core.telemetry.dump_sample`), plus a
last one when the spider closes, so the record ends on the final counts.
``scrapy banker plot`` draws it.

Also home of :class:`SamplingExtension`, the timer the metrics and progress
extensions share: sampling happens on the reactor thread, once per interval,
never per request.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.misc import load_object

from scrapy_banker.core.telemetry import dump_sample
from scrapy_banker.scheduler import running_banker
from scrapy_banker.scheduler.engine import looping_call
from scrapy_banker.settings import core_config, ops_config

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from typing_extensions import Self

    from scrapy_banker.core.telemetry import PlacementSample, Sample
    from scrapy_banker.scheduler import BankerScheduler
    from scrapy_banker.settings import OpsConfig

logger = logging.getLogger(__name__)

__all__ = ["BankerTimeseries", "SamplingExtension", "uses_banker_scheduler"]


def uses_banker_scheduler(crawler: Crawler) -> bool:
    """Whether the crawl's scheduler is a :class:`~scrapy_banker.scheduler.BankerScheduler`.

    Decided from the settings, before the engine exists: ``SCHEDULER`` names
    a subclass and ``BANKER_ENABLED`` does not turn it into Scrapy's own.
    """
    from scrapy_banker.scheduler import BankerScheduler

    if not core_config(crawler).enabled:
        return False
    try:
        cls = load_object(crawler.settings["SCHEDULER"])
    except (ImportError, NameError, ValueError):
        return False  # Scrapy itself will say what is wrong with it
    # The MRO, not issubclass: Scrapy's BaseScheduler metaclass calls any class
    # with the scheduler methods a subclass.
    return isinstance(cls, type) and BankerScheduler in cls.__mro__


class SamplingExtension:
    """Samples the running scheduler every interval on the reactor thread.

    Subclasses get :meth:`on_sample` with each sample and :meth:`on_close`
    with the final one.  A failing subclass logs once and stops its own
    timer; it never stops the crawl.
    """

    #: Names the extension in log messages.
    label = "sampling"

    def __init__(self, crawler: Crawler, config: OpsConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.interval = config.timeseries_interval
        self.scheduler: BankerScheduler | None = None
        self._task: Any = None
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @staticmethod
    def _check_scheduler(crawler: Crawler, cls: type) -> None:
        if not uses_banker_scheduler(crawler):
            # Bare: Scrapy logs a NotConfigured message as a warning.
            logger.debug("%s disabled: the scheduler is not a BankerScheduler", cls.__name__)
            raise NotConfigured()

    def spider_opened(self, spider: Spider) -> None:
        scheduler = running_banker(self.crawler)
        if scheduler is None:
            logger.debug("%s: no BankerScheduler running, nothing to sample", self.label)
            return
        if not self.start():
            return
        self.scheduler = scheduler
        self._task = looping_call(self._tick)
        self._task.start(self.interval, now=True)

    def spider_closed(self, spider: Spider, reason: str) -> None:
        if self._task is not None and self._task.running:
            self._task.stop()
        if self.scheduler is None:
            return
        try:
            final = self.scheduler.sample()
        except Exception:
            logger.exception("%s: could not take the final sample", self.label)
            final = None
        self.on_close(final)

    def _tick(self) -> None:
        scheduler = self.scheduler
        assert scheduler is not None  # the task runs only once one was found
        try:
            self.on_sample(scheduler.sample())
        except Exception:
            logger.exception("%s failed; it stops, the crawl goes on", self.label)
            if self._task is not None and self._task.running:
                self._task.stop()

    # -- for subclasses ------------------------------------------------------------------

    def start(self) -> bool:
        """The crawl started and a scheduler is there to sample; False: stay off."""
        return True

    def on_sample(self, sample: Sample) -> None:
        raise NotImplementedError

    def on_close(self, sample: Sample | None) -> None:
        """The spider closed; ``sample`` is the final one (None if it could not be taken)."""


class BankerTimeseries(SamplingExtension):
    """Appends one :class:`~scrapy_banker.core.telemetry.Sample` per interval to a JSON-lines file.

    A sample's placement map (every site's GNP coordinates) only changes
    when a plan does, every ``BANKER_PLACEMENT_INTERVAL`` seconds: it is
    written on the first line after each new plan and on the last line, not
    repeated on every line in between (readers take the latest one).
    """

    label = "BankerTimeseries"

    def __init__(self, crawler: Crawler, config: OpsConfig, path: str) -> None:
        super().__init__(crawler, config)
        self.path = Path(path)
        self.out: IO[str] | None = None
        self.lines = 0
        self._placement: PlacementSample | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = ops_config(crawler)
        if config.timeseries_file is None:
            raise NotConfigured()  # bare: being off is no reason to warn
        cls._check_scheduler(crawler, cls)
        return cls(crawler, config, config.timeseries_file)

    def start(self) -> bool:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Line-buffered: each sample reaches the file as it is taken, so a
            # plot of a crawl still running (or killed) has every line but the last.
            self.out = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            logger.error("BANKER_TIMESERIES_FILE: cannot write %s (%s); no record", self.path, exc)
            return False
        logger.info("Writing a time-series sample every %gs to %s", self.interval, self.path)
        return True

    def on_sample(self, sample: Sample) -> None:
        self._write(sample, final=False)

    def on_close(self, sample: Sample | None) -> None:
        out = self.out
        if out is None:
            return
        try:
            if sample is not None:
                self._write(sample, final=True)
        finally:
            self.out = None
            out.close()
        logger.info("Time series: %d samples in %s", self.lines, self.path)

    def _write(self, sample: Sample, *, final: bool) -> None:
        if self.out is None:
            return
        placement = sample.placement
        if placement is not None and placement is self._placement and not final:
            sample = dataclasses.replace(sample, placement=None)
        self._placement = placement
        dump_sample(sample, self.out)
        self.lines += 1
