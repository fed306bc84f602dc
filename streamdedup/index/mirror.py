"""A writer's copy in memory of an entry-valued index's merged tables, as sorted rows.

A table key found in LMDB costs ~1.5 us here, most of it cache and TLB misses in B-tree pages spread over the
map; the same keys in sorted arrays cost a fraction of that. LMDB stays the truth: the copy is used only while
the index's count of keyed batches is the one it was made at. Entry-valued tables change only in a batch that
adds keys (a merge, or a sweep inside one), and every such batch moves that count, so a batch of another
process makes the copy stale and it is dropped; rows of removed entries left in it are harmless, because a
lookup drops candidates whose entry is gone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .sorted_rows import SortedRows

__all__ = ["TableMirror", "MIRROR_ROW_BYTES"]

MIRROR_ROW_BYTES = 16
"""Memory a mirrored row takes: its key and its value, 64 bits each (probes are 64-bit: narrower keys would
make every binary search convert the whole array)."""


@dataclass(frozen=True)
class TableMirror:
    """Per table, its merged rows (None: not mirrored, read from LMDB), as of ``covers`` keyed batches.

    ``max_rows`` caps each table's copy (the memory budget shared by the tables)."""

    covers: int
    tables: tuple[SortedRows | None, ...]
    max_rows: int

    @classmethod
    def empty(cls, covers: int, tables: int, budget_bytes: int) -> TableMirror:
        return cls(covers, (None,) * tables, budget_bytes // (MIRROR_ROW_BYTES * max(tables, 1)))

    def fits(self, rows: int) -> bool:
        return rows <= self.max_rows

    def with_table(self, table: int, rows: SortedRows | None) -> TableMirror:
        """This copy with one table's rows replaced (None, or too many for the budget: not mirrored)."""
        kept = rows if rows is not None and self.fits(len(rows)) else None
        return replace(self, tables=self.tables[:table] + (kept,) + self.tables[table + 1 :])

    def advanced(self, covers: int) -> TableMirror:
        """This copy, valid at ``covers`` keyed batches (the batch that moved the count applied here)."""
        return replace(self, covers=covers)
