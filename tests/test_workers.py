"""Worker processes: calls, errors, and a worker killed at any moment (even mid-reply) never hangs the caller."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from streamdedup.garbage import BATCH_THRESHOLDS
from streamdedup.workers import WorkerDied, WorkerProcess, served_together
from tests.conftest import process_running


class Counter:
    def __init__(self, start: int) -> None:
        self.value = start


def add(state: Counter, amount: int) -> int:
    state.value += amount
    return state.value


def fail(state: Counter, message: str) -> None:
    raise KeyError(message)


def big_reply(state: Counter, marker: str, size: int) -> bytes:
    reply = b"x" * size
    Path(marker).touch()  # the reply is being sent from now on
    return reply


def slow_add(state: Counter, amount: int, seconds: float) -> int:
    time.sleep(seconds)
    return add(state, amount)


def thresholds(state: Counter) -> tuple[int, int, int]:
    return gc.get_threshold()


def refuse(start: int) -> Counter:
    raise ValueError(f"cannot start at {start}")


def test_calls_keep_state_and_raise_the_workers_exceptions() -> None:
    worker = WorkerProcess(Counter, (10,), name="test-counter")
    try:
        assert worker.call(add, 5) == 15
        assert worker.call(add, 1) == 16
        with pytest.raises(KeyError, match="missing"):
            worker.call(fail, "missing")
        assert worker.call(add, 0) == 16  # an exception does not end the worker
    finally:
        worker.stop()
        worker.stop()  # idempotent
    with pytest.raises(WorkerDied, match="stopped"):
        worker.call(add, 1)


def wait_for(state: Counter, marker: str) -> int:
    """Blocks the worker until ``marker`` exists: calls submitted meanwhile must wait in its pipe."""
    while not Path(marker).exists():
        time.sleep(0.001)
    return state.value


def test_calls_submitted_without_waiting_queue_in_the_worker_and_resolve_in_order(tmp_path: Path) -> None:
    worker = WorkerProcess(Counter, (0,), name="test-queue")
    marker = tmp_path / "go"
    try:
        blocked = worker.submit(wait_for, str(marker))
        queued = [worker.submit(add, amount) for amount in range(1, 51)]
        failing = worker.submit(fail, "queued")
        last = worker.submit(add, 1000)
        time.sleep(0.2)
        assert not blocked.done() and not any(future.done() for future in queued)
        marker.touch()
        assert blocked.result(timeout=30) == 0
        assert [future.result(timeout=30) for future in queued] == [n * (n + 1) // 2 for n in range(1, 51)]
        with pytest.raises(KeyError, match="queued"):
            failing.result(timeout=30)
        assert last.result(timeout=30) == 1275 + 1000
    finally:
        worker.stop()


def hold(state: Counter, started: str, marker: str) -> int:
    Path(started).touch()
    return wait_for(state, marker)


def add_all(state: Counter, calls: list[tuple[int]]) -> list[tuple[int, int]]:
    """A run of ``add_together`` calls at once, all or nothing: each call's running total and the run's length."""
    if any(amount < 0 for (amount,) in calls):
        raise ValueError("a negative amount is added alone")
    totals = []
    for (amount,) in calls:
        state.value += amount
        totals.append((state.value, len(calls)))
    return totals


@served_together(add_all, most=3)
def add_together(state: Counter, amount: int) -> tuple[int, int]:
    if amount < 0:
        raise ValueError(f"cannot add {amount}")
    return add(state, amount), 1


def test_calls_queued_one_after_another_are_served_together_up_to_the_most_and_alone_when_that_fails(
    tmp_path: Path,
) -> None:
    worker = WorkerProcess(Counter, (0,), name="test-together")
    started, marker = tmp_path / "started", tmp_path / "go"
    try:
        blocked = worker.submit(hold, str(started), str(marker))
        while not started.exists():  # the worker is up and busy: what follows queues behind the blocked call
            time.sleep(0.001)
        first = [worker.submit(add_together, 1) for _ in range(5)]
        plain = worker.submit(add, 10)
        second = [worker.submit(add_together, amount) for amount in (2, -1, 3)]
        time.sleep(0.2)  # every call is in the worker by now, behind the blocked one
        marker.touch()
        assert blocked.result(timeout=30) == 0
        # Runs of at most three, cut by a call of another function.
        assert [future.result(timeout=30) for future in first] == [(1, 3), (2, 3), (3, 3), (4, 2), (5, 2)]
        assert plain.result(timeout=30) == 15
        # The run with -1 fails as a whole and is served one by one: only -1's own call fails.
        assert second[0].result(timeout=30) == (17, 1)
        with pytest.raises(ValueError, match="cannot add -1"):
            second[1].result(timeout=30)
        assert second[2].result(timeout=30) == (20, 1)
        # Alone (nothing queued behind it), a call is served by the function itself.
        assert worker.call(add_together, 1) == (21, 1)
    finally:
        worker.stop()


def niceness(state: Counter) -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


def test_a_worker_collects_garbage_at_batch_thresholds() -> None:
    worker = WorkerProcess(Counter, (0,), name="test-gc")
    try:
        assert worker.call(thresholds) == BATCH_THRESHOLDS
    finally:
        worker.stop()


def test_a_worker_runs_at_the_niceness_asked_above_its_parents() -> None:
    worker = WorkerProcess(Counter, (0,), name="test-nice", niceness=3)
    try:
        assert worker.call(niceness) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 3)
    finally:
        worker.stop()


def test_an_argument_that_cannot_be_pickled_fails_its_own_call_only() -> None:
    worker = WorkerProcess(Counter, (1,), name="test-pickle")
    try:
        with pytest.raises(AttributeError, match="pickle"):
            worker.submit(add, lambda: 1)
        assert worker.call(add, 1) == 2
    finally:
        worker.stop()


def test_stop_lets_the_worker_finish_the_calls_already_submitted() -> None:
    worker = WorkerProcess(Counter, (0,), name="test-stop")
    futures = [worker.submit(add, 1) for _ in range(20)]
    worker.stop()
    assert [future.result(timeout=0) for future in futures] == list(range(1, 21))
    with pytest.raises(WorkerDied, match="stopped"):
        worker.submit(add, 1)


def test_the_initializers_error_reaches_the_first_call() -> None:
    worker = WorkerProcess(refuse, (3,), name="test-refuse")
    try:
        with pytest.raises(ValueError, match="cannot start at 3"):
            worker.call(add, 1)
        with pytest.raises(WorkerDied):
            worker.call(add, 1)
    finally:
        worker.stop()


def test_a_worker_ignores_sigint_and_sigterm_and_finishes_its_call() -> None:
    # A Ctrl-C or a SIGTERM sent to the whole process group reaches the workers too: the parent decides when
    # they stop, after the batch it is finishing.
    deaths: list[int] = []
    worker = WorkerProcess(Counter, (0,), name="test-signals", on_death=lambda: deaths.append(1))
    try:
        assert worker.call(add, 1) == 1  # serving: its signal dispositions are set
        assert worker.pid is not None
        busy = worker.submit(slow_add, 10, 1.0)
        time.sleep(0.2)
        os.kill(worker.pid, signal.SIGINT)
        os.kill(worker.pid, signal.SIGTERM)
        try:
            assert busy.result(timeout=30) == 11
        except KeyboardInterrupt:  # the worker's, sent back as the call's error: fail this test, not the run
            pytest.fail("SIGINT interrupted the worker's call")
        assert worker.call(add, 100) == 111
        assert worker.alive
    finally:
        worker.stop()
    assert deaths == []


def test_a_killed_worker_reports_its_death_once_and_a_stopped_one_does_not() -> None:
    deaths: list[str] = []
    killed = WorkerProcess(Counter, (0,), name="test-killed", on_death=lambda: deaths.append("killed"))
    stopped = WorkerProcess(Counter, (0,), name="test-stopped", on_death=lambda: deaths.append("stopped"))
    try:
        assert killed.call(add, 1) == 1 and stopped.call(add, 2) == 2
        assert killed.pid is not None
        os.kill(killed.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not deaths and time.monotonic() < deadline:  # no call is made: the death alone is reported
            time.sleep(0.05)
        assert not killed.alive and stopped.alive
    finally:
        stopped.stop()
        killed.stop()
    assert deaths == ["killed"]
    assert not stopped.alive


def test_a_worker_killed_while_sending_its_reply_fails_the_call_instead_of_hanging(tmp_path: Path) -> None:
    worker = WorkerProcess(Counter, (0,), name="test-big")
    marker = tmp_path / "replying"
    outcome: list[BaseException | bytes] = []

    def caller() -> None:
        try:
            outcome.append(worker.call(big_reply, str(marker), 400_000_000))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGKILL)
    thread.join(30)
    try:
        assert not thread.is_alive(), "the caller must not wait forever for the rest of the reply"
        assert len(outcome) == 1 and isinstance(outcome[0], WorkerDied)
        with pytest.raises(WorkerDied):
            worker.call(add, 1)
    finally:
        worker.stop()


ORPHAN_PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from streamdedup.workers import WorkerProcess

    def block(marker):
        Path(marker).touch()
        time.sleep(300)

    if __name__ == "__main__":
        worker = WorkerProcess(block, (sys.argv[1],), name="test-orphan")
        print(worker.pid, flush=True)
        time.sleep(300)
    """
)


def test_a_busy_worker_dies_with_its_killed_parent(tmp_path: Path) -> None:
    # Busy, so only the death signal can end it: an idle worker would also exit on its pipe's end-of-file.
    script = tmp_path / "parent.py"
    script.write_text(ORPHAN_PARENT)
    marker = tmp_path / "busy"
    with subprocess.Popen([sys.executable, str(script), str(marker)], stdout=subprocess.PIPE) as parent:
        try:
            assert parent.stdout is not None
            worker = int(parent.stdout.readline())
            deadline = time.monotonic() + 60
            while not marker.exists():
                assert time.monotonic() < deadline, "the worker never started its call"
                time.sleep(0.01)
        finally:
            parent.kill()
    deadline = time.monotonic() + 10
    while process_running(worker):
        assert time.monotonic() < deadline, f"worker {worker} outlived its killed parent"
        time.sleep(0.05)
