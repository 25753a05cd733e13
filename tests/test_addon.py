"""One ADDONS line wires the suite; explicit project settings still win."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from scrapy import Spider
from scrapy.utils.misc import load_object
from scrapy.utils.test import get_crawler

from scrapy_banker.addon import DOWNLOADER_MIDDLEWARES, EXTENSIONS, SCHEDULER, SPIDER_MIDDLEWARES


def _applied(settings: dict[str, object]) -> dict[str, object]:
    crawler = get_crawler(Spider, settings)
    crawler._apply_settings()
    s = crawler.settings

    def by_path(name: str) -> dict[str, int]:
        # Keys may be import strings or classes; compare them as import paths.
        out = {}
        for key, order in s.getdict(name).items():
            cls = load_object(key)
            out[f"{cls.__module__}.{cls.__qualname__}"] = order
        return out

    return {
        "SCHEDULER": s["SCHEDULER"],
        "SPIDER_MIDDLEWARES": by_path("SPIDER_MIDDLEWARES"),
        "DOWNLOADER_MIDDLEWARES": by_path("DOWNLOADER_MIDDLEWARES"),
        "EXTENSIONS": by_path("EXTENSIONS"),
    }


def _defined(components: dict[str, int]) -> dict[str, int]:
    """The add-on's components by where their classes are defined (as ``_applied`` names them)."""
    out = {}
    for path, order in components.items():
        cls = load_object(path)
        out[f"{cls.__module__}.{cls.__qualname__}"] = order
    return out


def test_addon_enables_scheduler_and_middlewares() -> None:
    got = _applied({"ADDONS": {"scrapy_banker.Addon": 500}})
    assert got["SCHEDULER"] == SCHEDULER
    for name, components in (
        ("SPIDER_MIDDLEWARES", SPIDER_MIDDLEWARES),
        ("DOWNLOADER_MIDDLEWARES", DOWNLOADER_MIDDLEWARES),
        ("EXTENSIONS", EXTENSIONS),
    ):
        assert _defined(components).items() <= got[name].items()  # type: ignore[union-attr]


def test_the_addon_names_every_component_where_a_scrapy_user_looks_for_it() -> None:
    # Middlewares in scrapy_banker.middlewares, extensions in scrapy_banker.extensions.
    for path in [*SPIDER_MIDDLEWARES, *DOWNLOADER_MIDDLEWARES]:
        assert path.startswith("scrapy_banker.middlewares."), path
    for path in EXTENSIONS:
        assert path.startswith("scrapy_banker.extensions."), path


def test_project_settings_win_over_the_addon() -> None:
    mw = "scrapy_banker.middlewares.BankerTopicMiddleware"
    got = _applied(
        {
            "ADDONS": {"scrapy_banker.Addon": 500},
            "SCHEDULER": "scrapy.core.scheduler.Scheduler",
            "SPIDER_MIDDLEWARES": {mw: 123},
        }
    )
    assert got["SCHEDULER"] == "scrapy.core.scheduler.Scheduler"
    assert got["SPIDER_MIDDLEWARES"][mw] == 123  # type: ignore[index]


def test_disabled_addon_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        got = _applied({"ADDONS": {"scrapy_banker.Addon": 500}, "BANKER_ENABLED": False})
    assert got["SCHEDULER"] == "scrapy.core.scheduler.Scheduler"
    assert not any("scrapy_banker" in k for k in got["SPIDER_MIDDLEWARES"])  # type: ignore[union-attr]
    assert "BANKER_ENABLED is False" in caplog.text
    # Switched off is not worth a warning on every crawl (Scrapy warns about a
    # NotConfigured that carries a message).
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [w for w in warnings if "banker" in w]


def test_invalid_setting_fails_at_startup() -> None:
    with pytest.raises(ValueError, match=r"BANKER_TOPICS\['news'\]='high'"):
        _applied({"ADDONS": {"scrapy_banker.Addon": 500}, "BANKER_TOPICS": {"news": "high"}})


def test_addon_importable_from_package_root() -> None:
    import scrapy_banker
    from scrapy_banker.addon import Addon

    assert scrapy_banker.Addon is Addon
    with pytest.raises(AttributeError):
        _ = scrapy_banker.NoSuchThing  # type: ignore[attr-defined]


def test_a_jobdir_of_ours_under_scrapys_own_scheduler_is_left_to_scrapy(tmp_path: Path) -> None:
    # Scrapy's BaseScheduler metaclass makes issubclass(Scheduler, BankerScheduler)
    # true: the add-on's JOBDIR check must not take Scrapy's scheduler for ours.
    (tmp_path / "banker").mkdir()
    got = _applied(
        {
            "ADDONS": {"scrapy_banker.Addon": 500},
            "SCHEDULER": "scrapy.core.scheduler.Scheduler",
            "JOBDIR": str(tmp_path),
        }
    )
    assert got["SCHEDULER"] == "scrapy.core.scheduler.Scheduler"


def test_running_banker_is_none_under_scrapys_own_scheduler() -> None:
    from types import SimpleNamespace

    from scrapy.core.scheduler import Scheduler

    from scrapy_banker.scheduler import BankerScheduler, running_banker

    crawler = get_crawler(Spider, {"ADDONS": {"scrapy_banker.Addon": 500}})
    crawler.engine = SimpleNamespace(scheduler=Scheduler.from_crawler(crawler))  # type: ignore[assignment]
    assert running_banker(crawler) is None
    ours = BankerScheduler.from_crawler(crawler)
    crawler.engine = SimpleNamespace(scheduler=ours)  # type: ignore[assignment]
    assert running_banker(crawler) is ours
