"""Entry ids as LMDB hands them over: one buffer of many records, each id a slice of it, decoded when read.

A lookup reads the records of thousands of candidates and needs the ids of the few it matches: decoding each
id up front cost as much as reading the records.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

__all__ = ["PackedIds"]


class PackedIds(Sequence[str]):
    """Ids at ``buffer[starts[i]:stops[i]]`` (UTF-8). Equal to any sequence of the same strings."""

    __slots__ = ("_buffer", "_starts", "_stops")

    def __init__(self, buffer: bytes, starts: np.ndarray, stops: np.ndarray) -> None:
        self._buffer = buffer
        self._starts = starts
        self._stops = stops

    def __len__(self) -> int:
        return len(self._starts)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return list(self.take(np.arange(len(self))[index]))
        return self._buffer[self._starts[index] : self._stops[index]].decode()

    def __iter__(self) -> Iterator[str]:
        buffer = self._buffer
        starts, stops = self._starts.tolist(), self._stops.tolist()
        return (buffer[start:stop].decode() for start, stop in zip(starts, stops, strict=True))

    def encoded(self) -> list[bytes]:
        """Each id's UTF-8 bytes, as stored."""
        return list(map(self._buffer.__getitem__, map(slice, self._starts.tolist(), self._stops.tolist())))

    def take(self, order: np.ndarray) -> PackedIds:
        """The ids at these positions, in this order, without decoding any."""
        return PackedIds(self._buffer, self._starts[order], self._stops[order])

    @classmethod
    def joined(cls, parts: Sequence[PackedIds]) -> PackedIds:
        """The ids of ``parts``, one after another, in one buffer."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls(b"", np.zeros(0, np.int64), np.zeros(0, np.int64))
        shifts = np.cumsum([0, *(len(part._buffer) for part in parts)])[:-1]
        return cls(
            b"".join(part._buffer for part in parts),
            np.concatenate([part._starts + shift for part, shift in zip(parts, shifts, strict=True)]),
            np.concatenate([part._stops + shift for part, shift in zip(parts, shifts, strict=True)]),
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedIds({list(self)!r})"
