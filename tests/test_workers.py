"""Worker processes: calls, errors, and a worker killed at any moment (even mid-reply) never hangs the caller."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from streamdedup.workers import WorkerDied, WorkerProcess


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


def test_the_initializers_error_reaches_the_first_call() -> None:
    worker = WorkerProcess(refuse, (3,), name="test-refuse")
    try:
        with pytest.raises(ValueError, match="cannot start at 3"):
            worker.call(add, 1)
        with pytest.raises(WorkerDied):
            worker.call(add, 1)
    finally:
        worker.stop()


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
