"""Entries found by a 64-bit hash of something each holds (its id, its content): rows of (hash, entry key) as the
sorted runs of ``table.SortedRuns``.

A batch appends one run and the runs merge four at a time, so a row is written about log4(entries / batch)
times, each time appended, where a B-tree keyed by hashes would dirty a random page per row. A row found names a
candidate that its caller confirms on the entry's record: hashes collide, and a removed entry's row stays (its
record is gone, so it no longer confirms) until the index holds as many such rows as entries; the next batch then
sweeps them, writing the rows again as one run without them. Rows of entries a rollback may restore stay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .sorted_rows import expand_ranges
from .store import META_COUNT, Store
from .table import SortedRuns

__all__ = ["HashedRuns"]


class HashedRuns:
    """Rows of (64-bit hash, entry key) in ``db``; the meta counter ``unswept`` holds the rows of removed entries
    since the last sweep."""

    def __init__(self, store: Store, db: Any, unswept: bytes, *, rows_in_memory: bool = False) -> None:
        self.store = store
        self.unswept = unswept
        self.runs = SortedRuns(store.env, db, 64, 8, store.fmt.entry_key_bytes, rows_in_memory=rows_in_memory)

    def read(self, txn: Any, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every row of these hashes (any order, repeated or not): the position in ``hashes`` of each row's hash,
        and its entry key, by position."""
        empty = np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.uint64)
        if not len(hashes):
            return empty
        distinct, inverse = np.unique(hashes, return_inverse=True)
        owners, seqs = self.runs.read(txn, distinct)
        if not len(owners):
            return empty
        # Each row found pairs with every position of its hash: one, unless the hashes asked for repeat.
        positions = np.argsort(inverse, kind="stable")
        starts = np.searchsorted(inverse[positions], np.arange(len(distinct) + 1))
        at, row = expand_ranges(starts[owners], starts[owners + 1])
        positions, seqs = positions[at], seqs[row]
        order = np.argsort(positions, kind="stable")
        return positions[order], seqs[order]

    def row_count(self, txn: Any) -> int:
        return self.runs.row_count(txn)

    def insert(self, txn: Any, hashes: np.ndarray, seqs: np.ndarray) -> None:
        """Store the rows of new entries: one run."""
        order = np.argsort(hashes, kind="stable")
        self.runs.insert(txn, hashes[order], np.asarray(seqs, dtype=np.uint64)[order])

    def removed(self, txn: Any, count: int) -> None:
        """This many entries were removed: their rows stay until a sweep."""
        self.store.put_counter(txn, self.unswept, self.store.counter(txn, self.unswept) + count)

    def restored(self, txn: Any, count: int) -> None:
        """This many removed entries were put back as they were: their rows stayed (a sweep keeps those a rollback
        may restore)."""
        self.store.put_counter(txn, self.unswept, max(self.store.counter(txn, self.unswept) - count, 0))

    def sweep(self, txn: Any, live: Callable[[], np.ndarray]) -> None:
        """Once rows of removed entries are as many as the entries, write the rows again without them: only the
        rows of ``live()`` entry keys (ascending) stay."""
        if self.store.counter(txn, self.unswept) < max(self.store.counter(txn, META_COUNT), 1):
            return
        keys, values = self.runs.rows(txn)
        kept = np.isin(values, live())
        self.runs.replace(txn, keys[kept], values[kept])
        self.store.put_counter(txn, self.unswept, 0)
