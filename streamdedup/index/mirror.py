"""A writer's copy in memory of an entry-valued index's merged tables, as sorted rows, and of the event times
and payloads of the entries it read lately.

A table key found in LMDB costs ~1.5 us here, most of it cache and TLB misses in B-tree pages spread over the
map; the same keys in sorted arrays cost a fraction of that. LMDB stays the truth: the copy is used only while
the index's count of keyed batches is the one it was made at. Entry-valued tables change only in a batch that
adds keys (a merge, or a sweep inside one), and every such batch moves that count, so a batch of another
process makes the copy stale and it is dropped; rows of removed entries left in it are harmless, because a
lookup drops candidates whose entry is gone.

Records never change while their entry lives (entry keys only grow, never reused once committed), so the
times and payloads a lookup read stay true until their entry is removed: the writer's own removals take them
out, and a batch of another process drops the copy with its tables. Every candidate is verified on its payload
(the sketch) and its time, and lookups on templates and boilerplate read the same few entries (a hot key leads
to its first entries) batch after batch: here they cost two gathers, not an LMDB read and a copy of the record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from .sorted_rows import SortedRows, key_dtype

__all__ = ["RecordCache", "TableMirror", "fetched_rows", "mirror_row_bytes"]


def mirror_row_bytes(key_bits: int) -> int:
    """Memory a mirrored row takes: its key (:func:`key_dtype`), its value (an entry key, 64 bits), and at most
    4 bytes of its table's directory (``sorted_rows.py``)."""
    return key_dtype(key_bits).itemsize + 8 + 4


_RECORDS_SHARE = 2
"""The records take this fraction (1/2) of the budget, the tables the rest: then both cover about as many entries
when a document keys ~14 of 32 tables (natural text: ~220 B of rows against 272 B of time and sketch)."""

_NO_ENTRY = np.uint64(np.iinfo(np.uint64).max)

Fetch = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
"""Entry keys (ascending, distinct) -> those found, their event times and their payloads."""


def fetched_rows(entries: np.ndarray, fetch: Fetch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each of ``entries`` (any order, repeated or not): whether it is stored, and its time and payload
    (zeros where it is not), each distinct entry fetched once."""
    distinct, inverse = np.unique(entries, return_inverse=True)
    found, found_times, found_payloads = fetch(distinct)
    times = np.zeros(len(distinct), dtype=np.float64)
    payloads = np.zeros((len(distinct), found_payloads.shape[1]), dtype=np.uint8)
    at = np.searchsorted(distinct, found)
    times[at], payloads[at] = found_times, found_payloads
    stored = np.zeros(len(distinct), dtype=bool)
    stored[at] = True
    return stored[inverse], times[inverse], payloads[inverse]


class RecordCache:
    """The event time and payload of entries stored or read lately, by entry key: a direct-mapped cache of
    ``slots`` rows (an entry's slot is its key modulo their number), filled as entries are stored and by the
    lookups that miss it. Entry keys are consecutive, so the newest entries never evict one another, and an old
    entry a hot key leads to stays until an entry of its slot is stored or read."""

    def __init__(self, slots: int, payload_bytes: int) -> None:
        self.slots = slots
        self.payload_bytes = payload_bytes
        self._entries = np.full(slots, _NO_ENTRY, dtype=np.uint64)
        self._times = np.zeros(slots, dtype=np.float64)
        self._payloads = np.zeros((slots, payload_bytes), dtype=np.uint8)

    @staticmethod
    def row_bytes(payload_bytes: int) -> int:
        """Memory a cached entry takes: its key, its time and its payload."""
        return 16 + payload_bytes

    def __len__(self) -> int:
        return int(np.count_nonzero(self._entries != _NO_ENTRY))

    def read(self, entries: np.ndarray, fetch: Fetch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`fetched_rows`, through the cache: the entries not held come from ``fetch`` (LMDB) and are held
        from then on."""
        if not self.slots:
            return fetched_rows(entries, fetch)
        slot = (entries % np.uint64(self.slots)).astype(np.intp)
        present = self._entries[slot] == entries
        times, payloads = self._times[slot], self._payloads[slot]
        if present.all():
            return present, times, payloads
        missing = np.flatnonzero(~present)
        present[missing], times[missing], payloads[missing] = fetched_rows(entries[missing], fetch)
        # Entries read together may share a slot: one of them is held.
        stored = missing[present[missing]]
        self._entries[slot[stored]] = entries[stored]
        self._times[slot[stored]], self._payloads[slot[stored]] = times[stored], payloads[stored]
        return present, times, payloads

    def hold(self, entries: np.ndarray, times: np.ndarray, payloads: np.ndarray) -> None:
        """Hold these entries' times and payloads (entries just stored), each in place of its slot's."""
        if not self.slots or not len(entries):
            return
        slot = (entries % np.uint64(self.slots)).astype(np.intp)
        self._entries[slot], self._times[slot], self._payloads[slot] = entries, times, payloads

    def forget(self, entries: np.ndarray) -> None:
        """Drop removed entries."""
        if not self.slots or not len(entries):
            return
        slot = (entries % np.uint64(self.slots)).astype(np.intp)
        self._entries[slot[self._entries[slot] == entries]] = _NO_ENTRY


@dataclass(frozen=True)
class TableMirror:
    """Per table, its merged rows (None: not mirrored, read from LMDB), as of ``covers`` keyed batches, and the
    records read lately (shared by every copy made from this one).

    ``max_rows`` caps each table's copy (half the memory budget, shared by the tables)."""

    covers: int
    tables: tuple[SortedRows | None, ...]
    max_rows: int
    records: RecordCache = field(default_factory=lambda: RecordCache(0, 0))

    @classmethod
    def empty(cls, covers: int, tables: int, budget_bytes: int, payload_bytes: int, key_bits: int) -> TableMirror:
        records = budget_bytes // _RECORDS_SHARE
        rows = (budget_bytes - records) // (mirror_row_bytes(key_bits) * max(tables, 1))
        cache = RecordCache(records // RecordCache.row_bytes(payload_bytes), payload_bytes)
        return cls(covers, (None,) * tables, rows, cache)

    def fits(self, rows: int) -> bool:
        return rows <= self.max_rows

    def with_table(self, table: int, rows: SortedRows | None) -> TableMirror:
        """This copy with one table's rows replaced (None, or too many for the budget: not mirrored)."""
        kept = rows if rows is not None and self.fits(len(rows)) else None
        return replace(self, tables=(*self.tables[:table], kept, *self.tables[table + 1 :]))

    def advanced(self, covers: int) -> TableMirror:
        """This copy, valid at ``covers`` keyed batches (the batch that moved the count applied here)."""
        return replace(self, covers=covers)
