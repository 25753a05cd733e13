"""The sample record: what is written is read back, and bad lines are named."""

from __future__ import annotations

import io
import json

import pytest

from scrapy_banker.core.telemetry import (
    BankerSample,
    FleetSample,
    PlacementSample,
    Sample,
    SlotSample,
    TopicSample,
    dump_sample,
    iter_samples,
    sample_from_dict,
)


def _sample(t: float = 1000.5) -> Sample:
    return Sample(
        t=t, node="w1", pages=42, queued=7, inflight=3,
        topics={"news": TopicSample(30, 5, 2, 1.5), "shop": TopicSample(12, 2, 1, 0.5)},
        slots=(SlotSample("a.test", 2, 4, 5), SlotSample("b.test", 1, 4, 0)),
        banker=BankerSample({"cpu": 4}, {"cpu": 1}, {"cpu": 3}, {"cpu": 2}, 3, 1),
        fleet=FleetSample(341, 1024, 9, 0, True),
        placement=PlacementSample(
            "topk", {"w1": [0.0, 1.5]}, {"a.test": [2.0, -1.0]}, {"a.test": "w1"}
        ),
    )  # fmt: skip


def test_a_sample_survives_its_json_line() -> None:
    out = io.StringIO()
    dump_sample(_sample(), out)
    dump_sample(Sample(t=2.0, node="solo", pages=0, queued=0, inflight=0), out)
    text = out.getvalue()
    assert text.count("\n") == 2
    read = [s for _, s in iter_samples(io.StringIO(text))]
    assert read == [_sample(), Sample(t=2.0, node="solo", pages=0, queued=0, inflight=0)]


def test_a_truncated_or_foreign_line_is_reported_not_fatal() -> None:
    out = io.StringIO()
    dump_sample(_sample(1.0), out)
    good = out.getvalue()
    text = good + '{"version": 99}\n' + "\n" + good[: len(good) // 2] + "\n" + good
    results = list(iter_samples(io.StringIO(text)))
    assert [n for n, _ in results] == [1, 2, 4, 5]
    assert isinstance(results[0][1], Sample) and isinstance(results[3][1], Sample)
    assert "version 99" in str(results[1][1])
    assert isinstance(results[2][1], ValueError)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pages": -1}, "'pages' must be an integer >= 0"),
        ({"t": float("nan")}, "'t' must be a finite number"),
        ({"topics": []}, "'topics' must be an object"),
        ({"slots": [{"slot": "a"}]}, "malformed sample"),
        ({"banker": {"total": 3}}, "'total' must be an object"),
        ({"placement": {"mode": "topk", "nodes": {"w": ["x"]}}}, "'x' must be a finite number"),
    ],
)
def test_bad_fields_are_named(change: dict[str, object], message: str) -> None:
    d = json.loads(json.dumps(_sample().to_dict()))
    d.update(change)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        sample_from_dict(d)
    with pytest.raises(ValueError, match="JSON object"):
        sample_from_dict([1, 2])
