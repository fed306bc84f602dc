"""A writer's copy in memory of an entry-valued index's merged tables, as sorted rows, and of the entry
records it read lately.

A table key found in LMDB costs ~1.5 us here, most of it cache and TLB misses in B-tree pages spread over the
map; the same keys in sorted arrays cost a fraction of that. LMDB stays the truth: the copy is used only while
the index's count of keyed batches is the one it was made at. Entry-valued tables change only in a batch that
adds keys (a merge, or a sweep inside one), and every such batch moves that count, so a batch of another
process makes the copy stale and it is dropped; rows of removed entries left in it are harmless, because a
lookup drops candidates whose entry is gone.

Records never change while their entry lives (entry keys only grow, never reused once committed), so the
records a lookup read stay true until their entry is removed: the writer's own removals take them out, and a
batch of another process drops the copy with its tables. Lookups on templates and boilerplate read the same
few records (a hot key leads to its first entries) batch after batch; here they cost a dictionary lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import islice, repeat
from operator import is_

import numpy as np

from .sorted_rows import SortedRows

__all__ = ["MIRROR_RECORD_BYTES", "MIRROR_ROW_BYTES", "RecordCache", "TableMirror"]

MIRROR_ROW_BYTES = 16
"""Memory a mirrored row takes: its key and its value, 64 bits each (probes are 64-bit: narrower keys would
make every binary search convert the whole array)."""

MIRROR_RECORD_BYTES = 640
"""Memory a cached record takes: a stored document's record (about 450 bytes) as a bytes object, and its
dictionary slot and key."""

_RECORDS_SHARE = 4
"""The records take this fraction (1/4) of the budget, the tables the rest."""


class RecordCache:
    """Raw entry records by entry key (big-endian bytes), the latest ``max_records`` read, oldest out first."""

    def __init__(self, max_records: int) -> None:
        self.max_records = max_records
        self._records: dict[bytes, bytes] = {}

    def __len__(self) -> int:
        return len(self._records)

    def read(self, keys: list[bytes], fetch: Callable[[list[bytes]], list[tuple[bytes, bytes]]]) -> list[bytes | None]:
        """The record of each key, None where no entry has it: those not held come from ``fetch`` (LMDB's
        ``getmulti``: the (key, record) pairs of the keys found) and are held from then on."""
        records = self._records
        values = list(map(records.get, keys))
        missing = np.flatnonzero(np.fromiter(map(is_, values, repeat(None)), dtype=bool, count=len(values)))
        if not len(missing):
            return values
        fetched = fetch([keys[i] for i in missing.tolist()])
        records.update(fetched)
        for i, value in zip(missing.tolist(), map(records.get, (keys[i] for i in missing.tolist())), strict=True):
            values[i] = value
        excess = len(records) - self.max_records
        if excess > 0:
            for key in list(islice(records, excess)):
                del records[key]
        return values

    def forget(self, keys: list[bytes]) -> None:
        """Drop the records of removed entries."""
        pop = self._records.pop
        for key in keys:
            pop(key, None)


@dataclass(frozen=True)
class TableMirror:
    """Per table, its merged rows (None: not mirrored, read from LMDB), as of ``covers`` keyed batches, and the
    records read lately (shared by every copy made from this one).

    ``max_rows`` caps each table's copy (three quarters of the memory budget, shared by the tables)."""

    covers: int
    tables: tuple[SortedRows | None, ...]
    max_rows: int
    records: RecordCache = field(default_factory=lambda: RecordCache(0))

    @classmethod
    def empty(cls, covers: int, tables: int, budget_bytes: int) -> TableMirror:
        records = budget_bytes // _RECORDS_SHARE
        rows = (budget_bytes - records) // (MIRROR_ROW_BYTES * max(tables, 1))
        return cls(covers, (None,) * tables, rows, RecordCache(records // MIRROR_RECORD_BYTES))

    def fits(self, rows: int) -> bool:
        return rows <= self.max_rows

    def with_table(self, table: int, rows: SortedRows | None) -> TableMirror:
        """This copy with one table's rows replaced (None, or too many for the budget: not mirrored)."""
        kept = rows if rows is not None and self.fits(len(rows)) else None
        return replace(self, tables=(*self.tables[:table], kept, *self.tables[table + 1 :]))

    def advanced(self, covers: int) -> TableMirror:
        """This copy, valid at ``covers`` keyed batches (the batch that moved the count applied here)."""
        return replace(self, covers=covers)
