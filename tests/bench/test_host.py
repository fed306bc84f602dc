from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import namedtuple

import psutil
import pytest

from streamdedup.bench.host import CpuMeter, StealClock, describe_steal, local_broker

LinuxTimes = namedtuple("LinuxTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
OtherTimes = namedtuple("OtherTimes", "user system idle")


def test_steal_is_its_share_of_all_cpu_time_with_guest_time_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = iter(
        [
            LinuxTimes(100.0, 0.0, 20.0, 300.0, 0.0, 0.0, 0.0, 10.0, 5.0, 0.0),
            # 60 s of user time (20 of it running a guest, counted in user too), 20 system, 20 steal: 100 s elapsed.
            LinuxTimes(160.0, 0.0, 40.0, 300.0, 0.0, 0.0, 0.0, 30.0, 25.0, 0.0),
        ]
    )
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
    samples = iter(
        [
            LinuxTimes(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
            LinuxTimes(50.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 50.0, 0.0, 0.0),
            LinuxTimes(140.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 60.0, 0.0, 0.0),
        ]
    )
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


def _busy(seconds: float) -> None:
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:
        pass


def test_the_cpu_meter_counts_this_process_its_children_live_and_waited_for_and_the_broker() -> None:
    broker = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
    busy_child = "import time\nd = time.process_time() + 0.3\nwhile time.process_time() < d: pass\ntime.sleep(30)"
    live = None
    try:
        meter = CpuMeter(psutil.Process(broker.pid))
        _busy(0.3)
        live = subprocess.Popen([sys.executable, "-c", busy_child])
        waited = subprocess.run([sys.executable, "-c", busy_child.replace("time.sleep(30)", "")], check=True)
        assert waited.returncode == 0
        while sum(psutil.Process(live.pid).cpu_times()[:2]) < 0.3:  # user and system
            time.sleep(0.05)
        seconds = meter.seconds()
        # The kernel counts CPU time in clock ticks (10 ms): both readings may be up to a tick short.
        assert 0.28 <= seconds["process"] < 1.0
        # The child still running and the one already waited for: ~0.3 s each, plus their interpreters' start.
        assert 0.55 <= seconds["children"] < 2.0
        assert seconds["broker"] is not None and 0.0 <= seconds["broker"] < 0.2
    finally:
        for process in (live, broker):
            if process is not None:
                process.kill()
                process.wait()
    # Once the broker is gone its time is unknown, not zero.
    assert meter.seconds()["broker"] is None
    assert CpuMeter().seconds()["broker"] is None


def test_the_local_broker_is_the_process_listening_on_the_first_bootstrap_port() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        found = local_broker(f"127.0.0.1:{port}, elsewhere:9092")
        assert found is not None and found.pid == os.getpid()
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        free = unused.getsockname()[1]
    assert local_broker(f"localhost:{free}") is None
    assert local_broker("no-port-given") is None


def test_no_local_broker_where_the_sockets_cannot_be_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(kind: str) -> list[object]:
        raise psutil.AccessDenied()

    monkeypatch.setattr(psutil, "net_connections", refuse)
    assert local_broker("127.0.0.1:9092") is None
