"""The pause before trying again after a failure: doubling up to a maximum, back to the start once it works."""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    """Pauses of ``first``, twice that, and so on up to ``maximum``; ``at_once``: a first pause of none."""

    def __init__(self, first: float, maximum: float, *, at_once: bool = False) -> None:
        self._first = first
        self._maximum = maximum
        self._start = 0.0 if at_once else first
        self._next = self._start

    def pause(self) -> float:
        """The pause before this attempt; the next one doubles it."""
        pause = self._next
        self._next = min(max(2 * pause, self._first), self._maximum)
        return pause

    def reset(self) -> None:
        """It worked: the next failure starts from the first pause again."""
        self._next = self._start
