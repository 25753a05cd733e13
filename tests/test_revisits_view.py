"""The operator's view of a crawl's revisits, from the file a crawl writes (a fleet's, read
from Redis, is summed by the same code: ``tests/test_commands.py`` runs it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scrapy_banker.core.change_rate import RateEstimate, freshness
from scrapy_banker.core.recrawl import UrlState
from scrapy_banker.ops.revisits_view import (
    RevisitTally,
    describe,
    duration,
    read_revisits,
    summarise,
)

NOW = 1.8e9


def _write(jobdir: Path, lines: list[str]) -> None:
    (jobdir / "banker").mkdir(parents=True, exist_ok=True)
    (jobdir / "banker" / "revisits.jsonl").write_text("".join(lines))


def _line(url: str, state: UrlState) -> str:
    return json.dumps({"u": url, "s": state.to_json(), "r": "{}"}) + "\n"


def test_a_jobdir_without_revisits_has_no_view(tmp_path: Path) -> None:
    assert read_revisits(str(tmp_path), NOW) is None


def test_the_view_counts_due_pages_the_next_due_time_and_estimates_freshness(
    tmp_path: Path,
) -> None:
    rate = RateEstimate(changed=3, changed_s=30.0, unchanged_n=1, unchanged_s=10.0)
    changing = UrlState(due=NOW - 120, interval=60.0, changes=3, unchanged=1, rate=rate)
    quiet = UrlState(due=NOW + 3600, interval=7200.0, changes=1, unchanged=4)
    _write(tmp_path, [
        _line("http://a.test/1", UrlState(due=NOW - 5, interval=10.0, failures=2)),
        _line("http://a.test/1", changing),  # the last line of a URL wins
        _line("http://a.test/2", quiet),
        "not json\n",
        '{"u": "http://a.test/3", "s": {"du',  # cut by a kill: never written
    ])  # fmt: skip
    view = read_revisits(str(tmp_path), NOW)
    assert view is not None
    assert (view.pages, view.due_now, view.malformed) == (2, 1, 1)
    assert view.most_overdue_s == pytest.approx(120) and view.next_due_s == pytest.approx(3600)
    assert (view.changes, view.unchanged, view.failures) == (4, 5, 0)
    estimated = rate.rate()
    assert estimated is not None
    assert view.freshness == pytest.approx((freshness(estimated, 1 / 60) + 1.0) / 2)
    assert view.to_json()["due_now"] == 1
    assert view.summary().startswith("Revisits: 2 pages, 1 due now (the latest 2 min late)")


def test_states_fed_one_at_a_time_sum_up_as_a_jobdir_file_does(tmp_path: Path) -> None:
    rate = RateEstimate(changed=2, changed_s=20.0, unchanged_n=3, unchanged_s=30.0)
    states = {
        "http://a.test/1": UrlState(due=NOW - 30, interval=10.0, changes=2, rate=rate),
        "http://a.test/2": UrlState(due=NOW, interval=60.0, unchanged=3),
        "http://b.test/1": UrlState(due=NOW + 90, interval=120.0, failures=1),
    }
    _write(tmp_path, [_line(u, s) for u, s in states.items()] + ["{}\n"])
    from_file = read_revisits(str(tmp_path), NOW)
    assert from_file is not None and from_file.malformed == 1
    assert summarise(states.values(), 1, NOW) == from_file
    # As a fleet's states stream out of Redis: JSON text, one that does not read.
    tally = RevisitTally(NOW)
    for text in [json.dumps(s.to_json()) for s in states.values()] + ['{"due": "soon"}']:
        try:
            tally.add(UrlState.from_text(text))
        except ValueError:
            tally.malformed += 1
    assert tally.view() == from_file
    assert from_file.most_overdue_s == 30 and from_file.due_now == 2  # due at NOW is due
    assert summarise([], 0, NOW) is None
    only_broken = summarise([], 2, NOW)
    assert only_broken is not None and only_broken.summary() == "Revisits: none kept"


def test_one_page_in_words() -> None:
    state = UrlState(due=NOW + 3 * 3600 + 12 * 60, interval=4 * 3600.0, unchanged=4)
    assert describe(state, NOW) == "due in 3 h 12 min, every 4 h, unchanged 4 times"
    late = UrlState(due=NOW - 65, interval=30.0, changes=2, failures=1)
    assert (
        describe(late, NOW) == "due now (1 min 5 s late), every 30 s, changed 2 times, failed once"
    )
    assert [duration(s) for s in (0.44, 12, 86_400 * 2 + 7200, -3)] == [
        "0.4 s",
        "12 s",
        "2 d 2 h",
        "0.0 s",
    ]
