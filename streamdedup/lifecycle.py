"""The protocol of every long-lived component: ``start()``, an idempotent ``stop()``, and ``async with``; and the
stop request its background work watches."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

__all__ = ["Lifecycle", "StopRequest"]


class Lifecycle(ABC):
    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


class StopRequest:
    """A stop asked of a running component (safe to ask from a signal handler); its pauses end early at it."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if a stop is asked meanwhile."""
        try:
            await asyncio.wait_for(self._event.wait(), seconds)
        except TimeoutError:
            pass
