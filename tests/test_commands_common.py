"""The commands' shared choices, without a crawl: which crawl a command looks at."""

from __future__ import annotations

import argparse

import pytest
from scrapy.settings import Settings

from scrapy_banker.ops.commands import CommandError
from scrapy_banker.ops.commands._common import jobdir_or_fleet


def _opts(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"jobdir": None, "prefix": None, **kw})


def test_jobdir_option_wins_then_the_fleet_then_the_jobdir_setting() -> None:
    fleet = Settings({"REDIS_URL": "redis://h/0", "JOBDIR": "/j"})
    assert jobdir_or_fleet(fleet, _opts(jobdir="/opt"), "nothing") == "/opt"
    assert jobdir_or_fleet(fleet, _opts(), "nothing") is None
    assert jobdir_or_fleet(Settings({"JOBDIR": "/j"}), _opts(), "nothing") == "/j"


def test_neither_says_what_to_give() -> None:
    with pytest.raises(CommandError, match=r"^nothing to inspect: give --jobdir DIR .* REDIS_URL"):
        jobdir_or_fleet(Settings(), _opts(), "nothing to inspect")
