"""What the decision core says of each document: a :class:`Verdict`, and a batch's as :class:`Verdicts`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise, repeat
from typing import Literal, NamedTuple, overload

import numpy as np

__all__ = ["Reason", "Verdict", "Verdicts"]

# "redelivered": the id of an earlier kept document from another origin (an upstream redelivery), whatever
# its text.
Reason = Literal["novel", "exact", "near", "redelivered", "unindexable"]

_STORED: Reason = "novel"
"""The reason of the documents the index stores: novel ones that could be looked up (not "unindexable")."""


class Verdict(NamedTuple):
    """What became of one document. ``match_id``/``distance`` name the earlier document it duplicates.
    A named tuple: immutable, and built several times faster than a frozen dataclass (one per document)."""

    novel: bool
    reason: Reason
    fingerprint: np.ndarray
    match_id: str | None = None
    distance: int | None = None
    jaccard: float | None = None
    error: str | None = None


@dataclass(frozen=True, eq=False)
class Verdicts(Sequence[Verdict]):
    """A batch's verdicts, column by column: ``novel`` and ``fingerprints`` as arrays for whoever reads the
    batch whole, and each row as a :class:`Verdict` on indexing or iteration (built then, not stored: a stored
    tuple per document costs its construction and the garbage collector's visits). Compared by identity: the
    columns hold arrays."""

    novel: np.ndarray
    reasons: list[Reason]
    fingerprints: np.ndarray
    match_ids: list[str | None]
    distances: list[int | None]
    jaccards: list[float | None]
    errors: tuple[str | None, ...]

    def __len__(self) -> int:
        return len(self.reasons)

    @overload
    def __getitem__(self, row: int) -> Verdict: ...

    @overload
    def __getitem__(self, row: slice) -> list[Verdict]: ...

    def __getitem__(self, row: int | slice) -> Verdict | list[Verdict]:
        if isinstance(row, slice):
            return [self[each] for each in range(*row.indices(len(self)))]
        return Verdict(
            bool(self.novel[row]),
            self.reasons[row],
            self.fingerprints[row],
            self.match_ids[row],
            self.distances[row],
            self.jaccards[row],
            self.errors[row],
        )

    @classmethod
    def joined(cls, first: Verdicts, second: Verdicts) -> Verdicts:
        """The verdicts of two consecutive parts of a batch, as one batch's."""
        return cls(
            np.concatenate([first.novel, second.novel]),
            first.reasons + second.reasons,
            np.concatenate([first.fingerprints, second.fingerprints]),
            first.match_ids + second.match_ids,
            first.distances + second.distances,
            first.jaccards + second.jaccards,
            first.errors + second.errors,
        )

    @property
    def stored(self) -> np.ndarray:
        """Which documents the index stored: the novel ones that could be looked up and stored."""
        return np.asarray(self.reasons, dtype=object) == _STORED

    def split(self, sizes: Sequence[int]) -> list[Verdicts]:
        """The verdicts of consecutive parts of this batch, of these sizes (the inverse of :meth:`joined`)."""
        if sum(sizes) != len(self):
            raise ValueError(f"parts of {sum(sizes)} documents for a batch of {len(self)}")
        bounds = np.cumsum([0, *sizes]).tolist()
        return [
            Verdicts(
                self.novel[low:high],
                self.reasons[low:high],
                self.fingerprints[low:high],
                self.match_ids[low:high],
                self.distances[low:high],
                self.jaccards[low:high],
                self.errors[low:high],
            )
            for low, high in pairwise(bounds)
        ]

    def __iter__(self) -> Iterator[Verdict]:
        columns = zip(
            self.novel.tolist(),
            self.reasons,
            list(self.fingerprints),
            self.match_ids,
            self.distances,
            self.jaccards,
            self.errors,
            strict=True,
        )
        # tuple.__new__ is what Verdict._make calls, here without a Python-level call per row.
        return map(tuple.__new__, repeat(Verdict), columns)
