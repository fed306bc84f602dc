"""How much of the machine a benchmark had: the CPU time the hypervisor gave to other tenants meanwhile.

On a shared virtual machine, steal is time a core of this guest was ready to run but served someone else.
A round run under heavy steal is slow for reasons outside the contestant, so the benches print it next to
their figures. psutil reads it on Linux, in clock ticks (usually 10 ms), so a round of a fraction of a
second reads it coarsely; elsewhere it is not known.
"""

from __future__ import annotations

import psutil

__all__ = ["StealClock", "describe_steal"]


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
