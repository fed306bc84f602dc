"""How much of the machine a benchmark had and took: the CPU time the hypervisor gave to other tenants
meanwhile, and the CPU time the contestant's own processes spent.

On a shared virtual machine, steal is time a core of this guest was ready to run but served someone else.
A round run under heavy steal is slow for reasons outside the contestant, so the benches print it next to
their figures. psutil reads it on Linux, in clock ticks (usually 10 ms), so a round of a fraction of a
second reads it coarsely; elsewhere it is not known. The CPU time a contestant spends per message moves far
less with the host's load than its rate does, so it tells what a change saved where rates only scatter.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from ..kafka.broker import LocalBroker

__all__ = ["CpuMeter", "StealClock", "bench_broker", "describe_steal", "local_broker"]


class StealClock:
    """Share of all cores' time stolen since the clock was started or last restarted."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self._start = psutil.cpu_times()

    def percent(self) -> float | None:
        """Stolen share of the elapsed CPU time in percent; None where the system does not report steal or no
        clock tick has passed."""
        now = psutil.cpu_times()
        if not hasattr(now, "steal"):
            return None
        elapsed = _total(now) - _total(self._start)
        if elapsed <= 0:
            return None
        return 100.0 * (now.steal - self._start.steal) / elapsed


def describe_steal(percent: float | None) -> str:
    return "n/a" if percent is None else f"{percent:.0f} %"


def _total(times: tuple[float, ...]) -> float:
    # Linux counts guest time in user and nice already.
    return sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


class CpuMeter:
    """CPU seconds (user and system) spent since the meter was started by this process, by its child processes
    (the live ones, and those it has waited for), and by a ``broker`` process if given."""

    def __init__(self, broker: psutil.Process | None = None) -> None:
        self._self = psutil.Process()
        self._broker = broker
        self._start = self._read()

    def seconds(self) -> dict[str, float | None]:
        """CPU seconds since the start: ``process`` (this one), ``children`` and ``broker`` (None without one,
        or once it is gone)."""
        now = self._read()
        return {role: _elapsed(self._start[role], value) for role, value in now.items()}

    def _read(self) -> dict[str, float | None]:
        own = self._self.cpu_times()
        # This process's own time from its CPU clock (nanoseconds): the kernel's per-process counts come in 10 ms
        # ticks, and a short window of a fast run can fall between two of them.
        process = time.process_time()
        children = own.children_user + own.children_system
        for child in self._self.children(recursive=True):
            try:
                times = child.cpu_times()
            except psutil.NoSuchProcess:
                continue  # ended between the listing and the reading: its time counts once it is waited for
            children += times.user + times.system
        broker = None
        if self._broker is not None:
            try:
                times = self._broker.cpu_times()
                broker = times.user + times.system
            except psutil.NoSuchProcess:
                pass
        return {"process": process, "children": children, "broker": broker}


def _elapsed(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


@contextmanager
def bench_broker(bootstrap: str | None) -> Iterator[str]:
    """The broker a Kafka benchmark runs on: ``bootstrap`` when given, else the local one (``var/kafka``),
    started if it is not running and then stopped again."""
    if bootstrap is not None:
        yield bootstrap
        return
    broker = LocalBroker(Path("var") / "kafka")
    was_running = broker.running()
    address = broker.start()
    try:
        yield address
    finally:
        if not was_running:
            broker.stop()


def local_broker(bootstrap: str) -> psutil.Process | None:
    """The process on this machine listening on the first bootstrap address's port (a local broker), if any."""
    port = urlsplit(f"//{bootstrap.split(',')[0].strip()}").port
    if port is None:
        return None
    try:
        for connection in psutil.net_connections(kind="tcp"):
            if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port and connection.pid:
                return psutil.Process(connection.pid)
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        pass  # sockets this user may not list (macOS), or a broker gone meanwhile: its CPU is then not counted
    return None
