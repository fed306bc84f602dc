"""Lifecycle: ``async with`` starts and stops; stop runs even when the block raises."""

from __future__ import annotations

import pytest

from streamdedup.lifecycle import Lifecycle


class Recorder(Lifecycle):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def start(self) -> None:
        self.calls.append("start")

    async def stop(self) -> None:
        self.calls.append("stop")


async def test_async_with_starts_then_stops() -> None:
    recorder = Recorder()
    async with recorder as entered:
        assert entered is recorder and recorder.calls == ["start"]
    assert recorder.calls == ["start", "stop"]


async def test_stop_runs_when_the_block_fails() -> None:
    recorder = Recorder()
    with pytest.raises(RuntimeError, match="boom"):
        async with recorder:
            raise RuntimeError("boom")
    assert recorder.calls == ["start", "stop"]


def test_start_and_stop_are_required() -> None:
    with pytest.raises(TypeError):
        Lifecycle()  # type: ignore[abstract]
