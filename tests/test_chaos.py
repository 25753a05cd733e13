"""The chaos soak (``benchmarks/chaos.py``): a short seeded run, and its bookkeeping.

The short run is the benchmark's ``--tiny`` mode as a subprocess (as a user
runs it): three real workers, a real ``redis-server`` with AOF, the farm, and
faults of every kind -- worker SIGKILL, Redis SIGKILL + restart,
``CLIENT PAUSE``, ``DEBUG SLEEP``, a worker SIGSTOP'd past its lease (a
zombie), a malformed payload -- in under a minute.  It asserts the soak's
targets, which are the frontier's guarantees: nothing lost, duplicates
within what the kills can explain, the per-host limit held fleet-wide, the
garbage dead-lettered with its reason.
The bookkeeping (the seeded schedule, the blame of each duplicate) is unit
tested on hand-made logs.
"""

from __future__ import annotations

import importlib
import itertools
import json
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import BENCH, run_python


def _chaos(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("chaos")


def _run(*args: str, timeout: float = 150) -> dict[str, Any]:
    proc = run_python(BENCH / "chaos.py", *args, timeout=timeout)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(result, dict)
    return result


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tiny_soak_loses_nothing_through_mixed_faults() -> None:
    # Every kind, the zombie too: a worker SIGCONT'd after its leases expired
    # once dispatched what it had buffered before it noticed that its
    # partitions moved (``zombie_fetched_after_resume`` duplicates, a host over
    # its limit within milliseconds of SIGCONT); it now gives back what it
    # cannot prove it still holds (``banker/redis/lease_lapsed``).
    kinds = "worker_kill,redis_kill,client_pause,debug_sleep,zombie,malformed_payload"
    result = _run("--tiny", "--seed", "3")
    for key in (
        "faults_injected", "lost", "duplicates", "duplicates_bound",
        "max_concurrent_per_host", "per_host_limit", "dead_lettered", "targets_met",
    ):  # fmt: skip
        assert key in result, key
    faults = result["faults_injected"]
    # Every kind asked for at least once (the tiny schedule is one shuffled round and more).
    assert all(faults[kind] >= 1 for kind in kinds.split(",")), faults
    assert result["pages_served"] >= result["expected_pages"] > 0
    assert result["lost"] == 0, result["lost_sample"]
    assert result["duplicates"] <= result["duplicates_bound"], result["duplicates_by_cause"]
    assert result["max_concurrent_per_host"] <= result["per_host_limit"], result[
        "politeness_violations"
    ]
    dead = result["dead_lettered"]
    assert dead["planted"] >= 1
    assert dead["planted_found"] == dead["planted"]
    assert all(reason.startswith("malformed") for reason in dead["reasons"]), dead["reasons"]
    assert result["worker_errors"] == {}
    assert not result["timed_out"]
    assert result["checks"]["zombies_fetched_nothing_foreign"]
    assert result["targets_met"] is True


def test_schedule_is_seeded_and_mixes_every_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    chaos = _chaos(monkeypatch)
    plan = chaos.schedule(random.Random(5), chaos.QUICK)
    assert plan == chaos.schedule(random.Random(5), chaos.QUICK)
    assert plan != chaos.schedule(random.Random(6), chaos.QUICK)
    times = [t for t, _ in plan]
    assert times == sorted(times)
    assert times[0] == chaos.QUICK.warmup_s and times[-1] <= chaos.QUICK.duration_s
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(chaos.QUICK.gap_s[0] - 0.01 <= g <= chaos.QUICK.gap_s[1] + 0.01 for g in gaps)
    # Shuffled rounds: the first len(KINDS) faults are one of each kind.
    assert sorted(k for _, k in plan[: len(chaos.KINDS)]) == sorted(chaos.KINDS)


def test_duplicates_are_blamed_on_the_fault_that_explains_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    chaos = _chaos(monkeypatch)

    def inc(slot: int, gen: int, **kw: Any) -> Any:
        return chaos.Incarnation(slot, gen, None, tmp_path / f"w{slot}.{gen}", 0.0, **kw)

    killed = inc(0, 0, killed_at=100.0)
    zombie = inc(1, 0, stops=[(200.0, 212.0)])
    other = inc(2, 0)
    logs = {
        "a": [(99.5, "w0.0"), (105.0, "w2.0")],  # in flight at the kill
        "b": [(199.0, "w1.0"), (209.0, "w2.0")],  # held by the zombie when stopped
        "c": [(210.0, "w2.0"), (212.5, "w1.0")],  # the zombie fetched the new owner's
        "d": [(50.0, "w2.0"), (60.0, "w2.0")],  # nothing explains it
        "e": [(30.0, "w0.0"), (150.0, "w2.0")],  # fetched long before the kill
        "g": [(199.5, "w1.0"), (213.0, "w1.0")],  # the zombie got its own lease back
    }
    fetches = {"a": 2, "b": 2, "c": 2, "d": 2, "e": 2, "f": 1, "g": 2}
    blame = chaos.attribute_duplicates(fetches, logs, [killed, zombie, other])
    assert blame.causes == {
        "worker_kill": 1,
        "zombie_redelivery": 2,
        "zombie_fetched_after_resume": 1,
        "unexplained": 2,
    }
    assert blame.per_event == {("w0.0", 100.0): 1, ("w1.0", 200.0): 3}
    assert blame.zombie_delays == [0.5]
    assert {u["url"] for u in blame.unexplained} == {"d", "e"}
    assert blame.mismatches == 0
