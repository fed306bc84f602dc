"""What the service counts as it goes: running totals, and dead letters logged in summaries."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..document import DeadLetter

__all__ = ["DeadLetterLog", "ServiceStats"]

log = logging.getLogger(__name__)


@dataclass
class ServiceStats:
    """Running totals since start (the demo prints them; metrics carry the same counts)."""

    consumed: int = 0
    published: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    dead_lettered: Counter[str] = field(default_factory=Counter)
    transactions: int = 0
    examples: list[tuple[str, str, int]] = field(default_factory=list)
    """(duplicate id, id it duplicates, Hamming distance) of the first few duplicates."""


class DeadLetterLog:
    """Dead letters logged as one warning per ``interval`` seconds at most: the count of each reason and the
    first letter of each, where a poisoned stream would otherwise write a line per record."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._counts: Counter[str] = Counter()
        self._examples: dict[str, DeadLetter] = {}
        self._since = time.monotonic()

    def add(self, letters: Sequence[DeadLetter]) -> None:
        for letter in letters:
            self._counts[letter.reason] += 1
            self._examples.setdefault(letter.reason, letter)
        self.flush_due()

    def flush_due(self) -> None:
        if self._counts and time.monotonic() - self._since >= self._interval:
            self.flush()

    def flush(self) -> None:
        now = time.monotonic()
        if self._counts:
            log.warning(
                "dead-lettered %d records in the last %.0f s: %s",
                self._counts.total(),
                now - self._since,
                "; ".join(
                    f"{count} {reason} (first: {self._examples[reason].id}: {self._examples[reason].detail[:200]})"
                    for reason, count in sorted(self._counts.items())
                ),
                extra={"dead_lettered": dict(self._counts)},
            )
        self._counts.clear()
        self._examples.clear()
        self._since = now
