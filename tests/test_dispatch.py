"""The dispatcher's reading of the machine's load (what the pacer calls saturated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scrapy_banker.core.pacing import Pacer, PacerConfig
from scrapy_banker.scheduler.dispatch import MachineLoad


def _stat(path: Path, busy: int, idle: int, iowait: int = 0) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    path.write_text(
        f"cpu  {busy} 0 0 {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1 2\n"
    )


def test_the_share_of_busy_cpus_between_two_reads(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    _stat(stat, busy=1000, idle=1000)
    load = MachineLoad(str(stat))
    assert load.busy() is None  # the first read only sets the mark
    _stat(stat, busy=1900, idle=1100)  # 900 busy of 1,000 ticks
    assert load.busy() == pytest.approx(0.9)
    _stat(stat, busy=2000, idle=1500, iowait=100)  # iowait counts as idle
    assert load.busy() == pytest.approx(100 / 600)
    assert load.busy() is None  # no tick passed: nothing to tell


def test_no_proc_stat_means_unknown_for_good(tmp_path: Path) -> None:
    load = MachineLoad(str(tmp_path / "absent"))
    assert load.busy() is None and load.available is False
    bad = tmp_path / "bad"
    bad.write_text("intr 1 2 3\n")
    assert MachineLoad(str(bad)).busy() is None


def test_a_busy_machine_saturates_the_pacer_whatever_the_process_used() -> None:
    pacer = Pacer(PacerConfig(saturation=0.8))
    pacer.refresh(0.0, 0.0, {}, 0, lambda s: 4)
    for _ in range(pacer.config.cpu_window):
        pacer.response("pole", 0.125)
    backlog = {"pole": 700, "small": 20}
    # The process got 40 % of a CPU, but every core of the machine was busy.
    assert pacer.refresh(1.0, 0.4, backlog, 720, lambda s: 4, machine_busy=0.97) == {"pole"}
    assert pacer.saturated and pacer.hold(2)
    assert pacer.refresh(2.0, 0.8, backlog, 720, lambda s: 4, machine_busy=0.5) == frozenset()
    assert not pacer.saturated and not pacer.hold(2)
