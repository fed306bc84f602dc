"""Table rows in memory, sorted by key, as lookups see them: a table's staged rows (those it has not merged
yet), and a writer's mirror of its merged rows (``mirror.py``).

Immutable: a change makes new rows, so whatever a lookup builds on one stays valid for as long as it is in
use, and a reader's copy is shared by every batch until another process changes the rows.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SortedRows", "expand_ranges", "key_dtype", "merged_rows", "run_starts"]

# Keys this short get a directory of every key (2**bits + 1 starts): a probe's rows are its key's bucket. Longer
# keys get one of their top bits, about one row a bucket, and a probe is settled within its bucket.
_DENSE_KEY_BITS = 20
# Rows of a bucket compared with the probe directly; larger buckets (hot keys, or an unlucky prefix) search.
_BUCKET_SCAN = 3
_LOOKUPS_BEFORE_DIRECTORY = 2
# Probes up to this many take two binary searches: the directory's dozen passes over the probes cost ~100 us
# whatever their number, a binary search a fraction of a microsecond a probe (less, as probes come ascending).
_FEW_PROBES = 512


def expand_ranges(low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every index in each [low[i], high[i]), with the i it came from."""
    counts = high - low
    most = counts.max(initial=0)
    if not most:
        # Most lookups of novel documents find nothing: two passes, not the seven below.
        return np.zeros(0, dtype=low.dtype), np.zeros(0, dtype=np.intp)
    if most == 1:
        # Most keys found hold one row: three passes.
        found = np.flatnonzero(counts)
        return low[found], found
    owner = np.repeat(np.arange(len(low)), counts)
    return low[owner] + np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts), owner


def run_starts(sorted_values: np.ndarray) -> np.ndarray:
    """Index of the first of each run of equal values (``sorted_values`` grouped, e.g. ascending)."""
    return np.flatnonzero(np.concatenate(([True], sorted_values[1:] != sorted_values[:-1])))


def key_dtype(key_bits: int) -> np.dtype:
    """What keys of ``key_bits`` bits are held as: 32-bit words where they fit (half the memory, and half the
    cache lines a search touches), else 64-bit."""
    return np.dtype(np.uint32 if key_bits <= 32 else np.uint64)


def merged_rows(
    keys: np.ndarray, values: np.ndarray, later_keys: np.ndarray, later_values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Two key-sorted row sets as one (of the first's types), each key's rows of ``later_keys`` after those of
    ``keys``: one search and two scatters. Not ``np.insert``, which sorts the positions again and builds its mask
    once per array."""
    later_keys = later_keys.astype(keys.dtype, copy=False)
    slots = np.searchsorted(keys, later_keys, side="right") + np.arange(len(later_keys))
    earlier = np.ones(len(keys) + len(later_keys), dtype=bool)
    earlier[slots] = False
    merged_keys = np.empty(len(earlier), keys.dtype)
    merged_values = np.empty(len(earlier), values.dtype)
    merged_keys[slots], merged_values[slots] = later_keys, later_values
    merged_keys[earlier], merged_values[earlier] = keys, values
    return merged_keys, merged_values


class SortedRows:
    """One table's rows: ``keys`` ascending (as :func:`key_dtype`), ``values`` beside them, keys of ``key_bits``
    bits. Probes and merged keys may come as any unsigned integers."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, key_bits: int) -> None:
        self.keys = keys.astype(key_dtype(key_bits), copy=False)
        self.values = values
        self.key_bits = key_bits
        self._bucket_starts: np.ndarray | None = None
        self._prefix_shift = 0
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
        """These rows (``keys`` ascending) merged in, after the equal keys already here."""
        return SortedRows(*merged_rows(self.keys, self.values, keys, values), self.key_bits)

    def bounds(self, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each probe key, the range [low, high) of the rows holding it."""
        # Searching keys of another width would convert the whole array.
        probes = probes.astype(self.keys.dtype, copy=False)
        if len(probes) <= _FEW_PROBES:
            return np.searchsorted(self.keys, probes, side="left"), np.searchsorted(self.keys, probes, side="right")
        if self._bucket_starts is None and self._lookups >= _LOOKUPS_BEFORE_DIRECTORY and len(self.keys):
            # Rows that outlive a batch (a writer's merged table between its merges, a reader's rows between two
            # writes): one pass over them pays for a directory that every further lookup starts from, where a
            # binary search of a large table takes a cache miss a step. A writer's staged rows change with each
            # batch, which looks them up twice (candidates, then key capacity), and keep the binary searches.
            self._build_directory()
        self._lookups += 1
        starts = self._bucket_starts
        if starts is None:
            return self._searched(probes)
        at = (probes >> np.uint64(self._prefix_shift)).astype(np.intp)
        low, end = starts[at].astype(np.intp), starts[at + 1].astype(np.intp)
        if self._prefix_shift == 0:
            return low, end
        # Sorted rows: the bucket's rows below the probe, counted in its first few, are where the probe's start.
        keys, last, size = self.keys, len(self.keys) - 1, end - low
        start = low.copy()
        for step in range(_BUCKET_SCAN):
            start += (keys[np.minimum(low + step, last)] < probes) & (size > step)
        large = np.flatnonzero(size > _BUCKET_SCAN)
        if len(large):
            start[large] = np.searchsorted(keys, probes[large], side="left")
        return start, self._ends(probes, start, end)

    def _build_directory(self) -> None:
        prefix_bits = (
            self.key_bits
            if self.key_bits <= _DENSE_KEY_BITS
            else min(self.key_bits, max(1, len(self.keys).bit_length() - 1))
        )
        self._prefix_shift = self.key_bits - prefix_bits
        starts = np.zeros((1 << prefix_bits) + 1, dtype=np.int32 if len(self.keys) < 1 << 31 else np.int64)
        prefixes = (self.keys >> np.uint64(self._prefix_shift)).astype(np.intp)
        np.cumsum(np.bincount(prefixes, minlength=1 << prefix_bits), out=starts[1:])
        self._bucket_starts = starts

    def _searched(self, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        low = np.searchsorted(self.keys, probes, side="left")
        return low, self._ends(probes, low, np.full(len(low), len(self.keys)))

    def _ends(self, probes: np.ndarray, low: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Where each probe's rows end, from where they start and a bound on their end. Most keys probed hold no
        row or one: the rows at ``low`` and ``low + 1`` settle them, and only keys holding more search again."""
        keys = self.keys
        if not len(keys):
            return low
        last = len(keys) - 1
        found = (low < end) & (keys[np.minimum(low, last)] == probes)
        high = low + found
        more = found & (low + 1 < end) & (keys[np.minimum(low + 1, last)] == probes)
        if more.any():
            high[more] = np.searchsorted(keys, probes[more], side="right")
        return high

    def read(self, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows of these keys (ascending, distinct), as a stored table's ``read`` gives them: the index in
        ``probes`` of each row's key, and its value."""
        rows, owners = expand_ranges(*self.bounds(probes))
        return owners, self.values[rows]
