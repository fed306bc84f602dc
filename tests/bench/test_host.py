from __future__ import annotations

import sys
from collections import namedtuple

import psutil
import pytest

from streamdedup.bench.host import StealClock, describe_steal

LinuxTimes = namedtuple("LinuxTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
OtherTimes = namedtuple("OtherTimes", "user system idle")


def test_steal_is_its_share_of_all_cpu_time_with_guest_time_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = iter([
        LinuxTimes(100.0, 0.0, 20.0, 300.0, 0.0, 0.0, 0.0, 10.0, 5.0, 0.0),
        # 60 s of user time (20 of it running a guest, counted in user too), 20 system, 20 steal: 100 s elapsed.
        LinuxTimes(160.0, 0.0, 40.0, 300.0, 0.0, 0.0, 0.0, 30.0, 25.0, 0.0),
    ])
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(samples))
    assert StealClock().percent() == pytest.approx(20.0)


def test_steal_is_unknown_where_the_system_does_not_report_it(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = iter([OtherTimes(1.0, 1.0, 1.0), OtherTimes(2.0, 2.0, 2.0)])
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(samples))
    assert StealClock().percent() is None


def test_no_elapsed_tick_gives_no_share(monkeypatch: pytest.MonkeyPatch) -> None:
    same = LinuxTimes(1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0)
    monkeypatch.setattr(psutil, "cpu_times", lambda: same)
    assert StealClock().percent() is None


def test_a_restart_measures_from_then(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = iter([
        LinuxTimes(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
        LinuxTimes(50.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 50.0, 0.0, 0.0),
        LinuxTimes(140.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 60.0, 0.0, 0.0),
    ])
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(samples))
    clock = StealClock()
    clock.restart()
    # From the restart: 90 s of user time and 10 of steal, not half of everything since the start.
    assert clock.percent() == pytest.approx(10.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="steal is reported on Linux")
def test_this_machine_reports_a_share_between_none_and_all() -> None:
    clock = StealClock()
    while (share := clock.percent()) is None:
        # Busy until the kernel's CPU times have moved on by a tick.
        sum(range(10_000))
    assert 0.0 <= share <= 100.0


def test_describe_steal() -> None:
    assert describe_steal(None) == "n/a"
    assert describe_steal(12.4) == "12 %"
    assert describe_steal(0.0) == "0 %"
