"""Table rows in memory, sorted by key, as lookups see them: a table's staged rows (those it has not merged
yet), and a writer's mirror of its merged rows (``mirror.py``).

Immutable: a change makes new rows, so whatever a lookup builds on one stays valid for as long as it is in
use, and a reader's copy is shared by every batch until another process changes the rows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SortedRows", "expand_ranges"]

# Keys this short get a bucket-start array (2**bits + 1 words) in place of two binary searches per probe.
_DENSE_KEY_BITS = 20


def expand_ranges(low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every index in each [low[i], high[i]), with the i it came from."""
    counts = high - low
    owner = np.repeat(np.arange(len(low)), counts)
    return low[owner] + np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts), owner


class SortedRows:
    """One table's rows: ``keys`` ascending, ``values`` beside them, keys of ``key_bits`` bits."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, key_bits: int) -> None:
        self.keys = keys
        self.values = values
        self.key_bits = key_bits
        self._bucket_starts: np.ndarray | None = None
        self._lookups = 0

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def nbytes(self) -> int:
        """Memory the rows hold (with their bucket starts, once built)."""
        starts = 0 if self._bucket_starts is None else self._bucket_starts.nbytes
        return self.keys.nbytes + self.values.nbytes + starts

    def emptied(self) -> SortedRows:
        return SortedRows(self.keys[:0], self.values[:0], self.key_bits)

    def kept(self, mask: np.ndarray) -> SortedRows:
        return SortedRows(self.keys[mask], self.values[mask], self.key_bits)

    def merged(self, keys: np.ndarray, values: np.ndarray) -> SortedRows:
        """These rows (``keys`` ascending) merged in, after the equal keys already here. Not ``np.insert``:
        that sorts the positions again and builds its mask once per array."""
        slots = np.searchsorted(self.keys, keys, side="right") + np.arange(len(keys))
        old_slots = np.ones(len(self.keys) + len(keys), dtype=bool)
        old_slots[slots] = False
        merged_keys = np.empty(len(old_slots), self.keys.dtype)
        merged_values = np.empty(len(old_slots), self.values.dtype)
        merged_keys[slots], merged_values[slots] = keys, values
        merged_keys[old_slots], merged_values[old_slots] = self.keys, self.values
        return SortedRows(merged_keys, merged_values, self.key_bits)

    def bounds(self, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each probe key, the range [low, high) of the rows holding it."""
        starts = self._bucket_starts
        if starts is None and self._lookups and self.key_bits <= _DENSE_KEY_BITS:
            # A second lookup on the same rows (a reader's batches between two writes): one pass over the rows
            # pays for bucket starts that every further lookup reads with two gathers. A writer's rows change
            # with each batch and keep the binary searches.
            starts = np.zeros((1 << self.key_bits) + 1, dtype=np.intp)
            np.cumsum(np.bincount(self.keys.astype(np.intp), minlength=1 << self.key_bits), out=starts[1:])
            self._bucket_starts = starts
        self._lookups += 1
        if starts is not None:
            at = probes.astype(np.intp)
            return starts[at], starts[at + 1]
        keys = self.keys
        low = np.searchsorted(keys, probes, side="left")
        if not len(keys):
            return low, low
        # Most keys probed hold no row or one: the rows at low and low + 1 settle them, and only keys holding
        # more take a second binary search (a third of the cost of one for every probe).
        last = len(keys) - 1
        found = keys[np.minimum(low, last)] == probes
        high = low + found
        more = found & (keys[np.minimum(low + 1, last)] == probes) & (low < last)
        if more.any():
            high[more] = np.searchsorted(keys, probes[more], side="right")
        return low, high

    def read(self, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows of these keys (ascending, distinct), as a stored table's ``read`` gives them: the index in
        ``probes`` of each row's key, and its value."""
        rows, owners = expand_ranges(*self.bounds(probes))
        return owners, self.values[rows]
