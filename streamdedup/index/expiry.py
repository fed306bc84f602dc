"""Removal and what drives it: expiry by event time, ``max_entries`` eviction, sweeps of an entry-valued index's
tables, and ``rollback``, which undoes the newest batches whole from their undo records (``undo.py``).

Removal deletes a fold-valued table's rows that no surviving entry shares. An entry-valued table keeps a removed
entry's rows until its sweep (see the ``segment`` docstring): a lookup drops candidates whose entry is gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import compress, takewhile
from typing import Any

import numpy as np

from .cached import Cached
from .keys import table_rows
from .lookup import Lookup
from .sorted_rows import SortedRows
from .staging import Staging
from .store import (
    META_CLOCK,
    META_CLOCK_WINDOW,
    META_COUNT,
    META_NEXT_MERGE,
    META_NEXT_SEQ,
    META_UNSWEPT,
    NO_TOPIC,
    U64,
    Store,
    keys_of_ids,
    orderable_time,
    origin_keys,
    seq_bytes,
)
from .table import rows_in
from .undo import Undo, UndoRecord, UndoRecords

__all__ = ["Expiry"]


class Expiry:
    """Removal of entries from one store, and the undoing of batches."""

    def __init__(self, store: Store, cached: Cached, lookup: Lookup, staging: Staging, undo: UndoRecords) -> None:
        self.store = store
        self.fmt = store.fmt
        self.cached = cached
        self.lookup = lookup
        self.staging = staging
        self.undo = undo

    def expire(self, txn: Any, cutoff: float, undo: Undo | None) -> int:
        # Whole buckets go; an entry at most one bucket younger than the cutoff waits for its bucket
        # (queries pass min_time to hide it meanwhile).
        return self.remove(txn, self.pop_oldest(txn, float(np.floor(cutoff / self.fmt.time_bucket)), undo), undo)

    def pop_oldest(self, txn: Any, before_bucket: float, undo: Undo | None) -> np.ndarray:
        """Take the entry keys of every time bucket before ``before_bucket``; their rows are deleted."""
        end = seq_bytes(orderable_time(np.array([before_bucket])))[0]
        chunks: list[np.ndarray] = []
        with txn.cursor(self.store.times) as cursor:
            moved = cursor.first()
            while moved and cursor.key()[:8] < end:
                if undo is not None:
                    undo.times.setdefault(cursor.key(), cursor.value())
                spans = np.frombuffer(cursor.value(), dtype=U64).astype(np.uint64).reshape(-1, 2)
                chunks.extend(np.arange(a, b, dtype=np.uint64) for a, b in spans.tolist())
                # delete() steps to the successor; past the last row the cursor holds no key.
                cursor.delete()
                moved = bool(cursor.key())
        return np.concatenate(chunks) if chunks else np.zeros(0, np.uint64)

    def evict(self, txn: Any, max_entries: int, undo: Undo) -> int:
        """Remove the entries no later document can see: those with ``max_entries`` or more kept documents
        stored after them (``SegmentIndex.kept_after``). The oldest ``times`` rows go too once they name only
        removed entries; a row that names others as well waits for expiry (a removal skips keys already gone)."""
        bound = self.store.counter(txn, META_NEXT_SEQ) - max_entries
        if bound <= 0:
            return 0
        end = seq_bytes(np.array([bound], dtype=np.uint64))[0]
        with txn.cursor(self.store.entries) as cursor:
            # Skipped keys make kept_after smaller than the key distance: every evicted entry is below ``end``.
            below = b"".join(takewhile(lambda key: bytes(key) < end, cursor.iternext(keys=True, values=False)))
        seqs = np.frombuffer(below, dtype=U64).astype(np.uint64)
        seqs = seqs[self.store.kept_after(txn, seqs) >= max_entries]
        if not len(seqs):
            return 0
        removed = self.remove(txn, seqs, undo)
        cut = int(seqs[-1]) + 1
        with txn.cursor(self.store.times) as cursor:
            moved = cursor.first()
            while moved and int(np.frombuffer(cursor.value(), dtype=U64)[1::2].max()) <= cut:
                undo.times.setdefault(cursor.key(), cursor.value())
                cursor.delete()
                moved = bool(cursor.key())
        return removed

    def remove(self, txn: Any, seqs: np.ndarray, undo: Undo | None, *, never_kept: bool = False) -> int:
        """Remove these entries (``never_kept``: rolled back, so that an entry-valued table loses their rows now, as
        if they had never been stored, where a removed entry's rows stay until a sweep and count till then)."""
        if not len(seqs):
            return 0
        entries, head, ids = self.lookup.fetch(txn, seqs)
        n = len(entries)
        if not n:
            return 0
        seq_keys = seq_bytes(entries)
        self.cached.entries_removed(txn, entries)
        id_bytes = ids.encoded()
        if undo is not None:
            undo.removed_seqs.append(entries)
            undo.removed_heads.append(head)
            undo.removed_ids.extend(id_bytes)
        for key in seq_keys:
            txn.delete(key, db=self.store.entries)
        self.lookup.ids.removed(txn, id_bytes, entries)
        self.lookup.contents.removed(txn, n)
        for key in origin_keys(head[head["topic"] != NO_TOPIC]):
            txn.delete(key, db=self.store.origins)
        if self.fmt.entry_valued and never_kept:
            self._drop_entry_rows(txn, entries, head)
        elif self.fmt.entry_valued:
            # Each entry has rows of its own, and they stay, staged or merged, until their table is swept: a
            # lookup reads every candidate's record and drops those of removed entries. Deleting them here
            # dirtied a random page of every table per entry, which each commit wrote out again.
            self.store.put_unswept(txn, self.store.unswept(txn) + np.uint64(n))
        else:
            self._remove_fold_rows(txn, seq_keys, head, undo)
        self.store.put_counter(txn, META_COUNT, self.store.counter(txn, META_COUNT) - n)
        return n

    def _drop_entry_rows(self, txn: Any, entries: np.ndarray, head: np.ndarray) -> None:
        """Delete these entries' rows from an entry-valued index's tables, staged or merged. Rollbacks are rare and
        undo the newest batches, whose rows are mostly still staged: a table is written again only where one of
        its merges took some."""
        keys, _, _ = table_rows(self.fmt.plan, head["fp"].reshape(len(head), self.fmt.words).astype(np.uint64))
        values = entries.astype(np.uint64)
        for table in range(len(self.store.tables)):
            self.staging.drop(txn, table, keys[table], values)
            merged_keys, merged_values = self.staging.rows_present(txn, table, keys[table], values)
            if not len(merged_keys):
                continue
            stored_keys, stored_values = self._merged_rows(txn, table)
            kept = ~rows_in(stored_keys, stored_values, merged_keys, merged_values)
            self._rewrite(txn, table, stored_keys[kept], stored_values[kept])

    def _remove_fold_rows(self, txn: Any, seq_keys: list[bytes], head: np.ndarray, undo: Undo | None) -> None:
        """Delete removed entries' folds (entry keys and records given), and the table rows of folds no surviving
        entry shares."""
        n = len(head)
        keys, values, folds = table_rows(self.fmt.plan, head["fp"].reshape(n, self.fmt.words).astype(np.uint64))
        fold_keys = seq_bytes(folds)
        for i in range(n):
            txn.delete(fold_keys[i], seq_keys[i], db=self.store.folds)
        with txn.cursor(self.store.folds) as cursor:
            survivors = cursor.getmulti(seq_bytes(np.unique(folds)), dupdata=True, dupfixed_bytes=8, keyfixed=True)
        survivor_rows = np.frombuffer(survivors, dtype=np.uint8).reshape(-1, 16)
        survivor_seqs = survivor_rows[:, 8:].copy().view(U64).astype(np.uint64).ravel()
        if len(survivor_seqs):
            survivor_keys, survivor_values, _ = table_rows(
                self.fmt.plan, self.lookup.records(txn, survivor_seqs).fingerprints
            )
        for table, stored_table in enumerate(self.store.tables):
            doomed_keys, doomed_values = keys[table], values[table]
            if len(survivor_seqs):
                doomed = ~rows_in(doomed_keys, doomed_values, survivor_keys[table], survivor_values[table])
                doomed_keys, doomed_values = doomed_keys[doomed], doomed_values[doomed]
            if undo is not None:
                undo.table_rows.append((table, *self.staging.rows_present(txn, table, doomed_keys, doomed_values)))
            stored_table.delete(txn, doomed_keys, doomed_values)
            self.staging.drop(txn, table, doomed_keys, doomed_values)

    def sweep_due(self, txn: Any, table: int) -> bool:
        """Whether a table may hold as many rows of removed entries as of live ones, times 1 to 2 (staggered over
        the tables, so that their sweeps fall on different batches): a sweep then reads at most three rows and
        writes at most one per removal."""
        unswept = int(self.store.unswept(txn)[table])
        return unswept * len(self.store.tables) >= max(self.store.counter(txn, META_COUNT), 1) * (
            len(self.store.tables) + table
        )

    def sweep(self, txn: Any, table: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Rewrite an entry-valued table with its stored rows and these (its staged rows and a batch's, keys
        ascending within each), leaving out the rows of removed entries."""
        stored_keys, stored_values = self._merged_rows(txn, table)
        keys, values = np.concatenate([stored_keys, keys]), np.concatenate([stored_values, values])
        alive = np.isin(values, self._live(txn))
        keys, values = keys[alive], values[alive]
        # Within a key, rows come in entry order (a table takes its rows batch after batch), which is the value
        # order LMDB keeps; a stable sort of already sorted runs only merges them.
        order = np.argsort(keys, kind="stable")
        self._rewrite(txn, table, keys[order], values[order])
        unswept = self.store.unswept(txn)
        unswept[table] = 0
        self.store.put_unswept(txn, unswept)

    def _merged_rows(self, txn: Any, table: int) -> tuple[np.ndarray, np.ndarray]:
        """An entry-valued table's merged rows, from its copy in memory when there is one (reading them from LMDB
        costs ~0.75 us a row)."""
        mirror = self.cached.table_mirror(txn)
        mirrored = mirror.tables[table] if mirror is not None else None
        if mirrored is not None:
            return mirrored.keys, mirrored.values
        return self.store.entry_table(table).rows(txn)

    def _rewrite(self, txn: Any, table: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Store exactly these rows (keys ascending) as an entry-valued table's merged rows, and in its copy."""
        stored_table = self.store.entry_table(table)
        stored_table.replace(txn, keys, values)
        self.cached.mirror_replaced(txn, table, SortedRows(keys, values, stored_table.key_bits))

    def sweep_hashed(self, txn: Any) -> None:
        """Sweep the rows of removed entries from the ids and the contents, each when due (see ``hashed_runs``)."""
        self.lookup.ids.sweep(txn, lambda: self._live(txn))
        self.lookup.contents.sweep(txn, lambda: self._live(txn))

    def _live(self, txn: Any) -> np.ndarray:
        """The entry keys a sweep keeps rows of, ascending: the stored entries, and the removed ones a rollback may
        restore (so that a restored entry is found as before)."""
        with txn.cursor(self.store.entries) as cursor:
            live = np.frombuffer(b"".join(cursor.iternext(keys=True, values=False)), dtype=U64).astype(np.uint64)
        return np.union1d(live, self.undo.restorable_seqs(txn))

    def rollback(self, txn: Any, offsets: Mapping[tuple[str, int], int]) -> int:
        """See ``SegmentIndex.rollback``."""
        topic_ids = self.store.topic_ids(txn, (topic for topic, _ in offsets))
        targets = {(topic_ids[topic], int(partition)): int(offset) for (topic, partition), offset in offsets.items()}
        removed = 0
        undone_from = None
        for key, raw in self.undo.newest_first(txn):
            record = UndoRecord.unpack(raw, self.fmt.record)
            added = self._seqs_from(txn, record.first_seq)
            if not self._rolled_back(txn, added, record, targets):
                break
            removed += self._undo_batch(txn, key, record, added)
            undone_from = record.first_seq
        if undone_from is not None:
            self._skip(txn, undone_from)
        left = self._doomed(txn, targets)
        if len(left):
            # Rolled back, these documents were never kept: their keys count for no earlier entry.
            self._skip_keys(txn, left)
            removed += self.remove(txn, left, None, never_kept=True)
            self.undo.forget(txn)
        self.store.put_source_offsets(txn, offsets)
        return removed

    def _skip(self, txn: Any, first_seq: int) -> None:
        """Record the entry keys from ``first_seq`` on, which undone batches had taken, as skipped; runs below
        every stored entry and every entry a later rollback may restore no longer count for any of them."""
        next_seq = self.store.counter(txn, META_NEXT_SEQ)
        runs = self.store.skipped(txn)
        # Runs from first_seq on lie within the new one: an older rollback's, whose batches this one undoes too.
        runs = np.concatenate([runs[runs[:, 0] < first_seq], np.array([[first_seq, next_seq]], dtype=np.uint64)])
        with txn.cursor(self.store.entries) as cursor:
            oldest = [int.from_bytes(cursor.key(), "big")] if cursor.first() else [next_seq]
        oldest.extend(self.undo.restorable_seqs(txn)[:1].tolist())
        self.store.put_skipped(txn, runs[runs[:, 1] > np.uint64(min(oldest))])

    def _skip_keys(self, txn: Any, seqs: np.ndarray) -> None:
        """Record these entry keys (of stored entries) as skipped, in runs of consecutive keys."""
        seqs = np.unique(seqs.astype(np.uint64))
        breaks = np.flatnonzero(np.diff(seqs) != 1) + 1
        starts = seqs[np.concatenate([[0], breaks])]
        ends = seqs[np.concatenate([breaks - 1, [len(seqs) - 1]])] + np.uint64(1)
        runs = np.concatenate([self.store.skipped(txn), np.stack([starts, ends], axis=1)])
        self.store.put_skipped(txn, runs[np.argsort(runs[:, 0], kind="stable")])

    def _doomed(self, txn: Any, targets: Mapping[tuple[int, int], int]) -> np.ndarray:
        """Entry keys of the entries whose origin is at or past its partition's target offset."""
        doomed = []
        with txn.cursor(self.store.origins) as cursor:
            for (topic_id, partition), offset in targets.items():
                prefix = topic_id.to_bytes(4, "big") + partition.to_bytes(4, "big")
                moved = cursor.set_range(prefix + offset.to_bytes(8, "big"))
                while moved and cursor.key()[:8] == prefix:
                    doomed.append(cursor.value())
                    moved = cursor.next()
        return np.frombuffer(b"".join(doomed), dtype=U64).astype(np.uint64)

    def _seqs_from(self, txn: Any, first_seq: int) -> np.ndarray:
        """Entry keys of the stored entries from ``first_seq`` on."""
        with txn.cursor(self.store.entries) as cursor:
            if not cursor.set_range(seq_bytes(np.array([first_seq]))[0]):
                return np.zeros(0, np.uint64)
            keys = b"".join(cursor.iternext(keys=True, values=False))
        return np.frombuffer(keys, dtype=U64).astype(np.uint64)

    def _rolled_back(
        self, txn: Any, added: np.ndarray, record: UndoRecord, targets: Mapping[tuple[int, int], int]
    ) -> bool:
        """Whether every entry the newest batch left to undo stored (``added``, those still stored, and those it
        removed itself) comes from a rolled-back offset."""
        _, heads, _ = self.lookup.fetch(txn, added)
        heads = np.concatenate([heads, record.heads[record.seqs >= np.uint64(record.first_seq)]])
        if not len(heads):
            return False
        for topic, partition, offset in zip(
            heads["topic"].tolist(), heads["partition"].tolist(), heads["offset"].tolist(), strict=True
        ):
            target = targets.get((topic, partition)) if topic != NO_TOPIC else None
            if target is None or offset < target:
                return False
        return True

    def _undo_batch(self, txn: Any, key: bytes, record: UndoRecord, added: np.ndarray) -> int:
        """Remove a batch's entries and put back what it changed; returns how many of its entries were stored."""
        removed = self.remove(txn, added, None, never_kept=True)
        older = record.seqs < np.uint64(record.first_seq)
        self._restore(
            txn,
            record.seqs[older],
            record.heads[older],
            [i for i, old in zip(record.ids, older.tolist(), strict=True) if old],
        )
        tables, row_keys, row_values = record.rows
        for table in np.unique(tables).tolist():
            mine = tables == table
            keys, values = row_keys[mine], row_values[mine]
            present_keys, present_values = self.staging.rows_present(txn, table, keys, values)
            wanted = ~rows_in(keys, values, present_keys, present_values)
            if wanted.any():
                pairs = np.unique(np.stack([keys[wanted], values[wanted]], axis=1), axis=0)
                self.store.tables[table].insert(txn, pairs[:, 0].copy(), pairs[:, 1].copy())
        for time_key, value in record.times:
            if value is None:
                txn.delete(time_key, db=self.store.times)
            else:
                txn.put(time_key, value, db=self.store.times)
        for meta_key, value in ((META_CLOCK, record.clock), (META_CLOCK_WINDOW, record.window)):
            if value is None:
                txn.delete(meta_key, db=self.store.meta)
            else:
                txn.put(meta_key, value, db=self.store.meta)
        self.store.put_counter(txn, META_COUNT, record.count)
        if record.merge_turn is not None:
            self.store.put_counter(txn, META_NEXT_MERGE, record.merge_turn)
        if record.unswept is not None:
            txn.put(META_UNSWEPT, record.unswept, db=self.store.meta)
        txn.delete(key, db=self.store.undo)
        return removed

    def _restore(self, txn: Any, seqs: np.ndarray, heads: np.ndarray, id_bytes: list[bytes]) -> None:
        """Put back removed entries as they were (their records, ids, origins and folds), and their keys in the
        key filter. An entry-valued table still holds their rows (sweeps keep them while they can be restored)."""
        if not len(seqs):
            return
        seq_keys = seq_bytes(seqs)
        with txn.cursor(self.store.entries) as cursor:
            cursor.putmulti(zip(seq_keys, self.fmt.records.encode(heads, id_bytes), strict=True))
        self.lookup.ids.restored(txn, id_bytes, seqs)
        self.lookup.contents.restored(txn, len(seqs))
        with_origin = heads["topic"] != NO_TOPIC
        with txn.cursor(self.store.origins) as cursor:
            cursor.putmulti(zip(origin_keys(heads[with_origin]), compress(seq_keys, with_origin.tolist()), strict=True))
        keys, _, folds = table_rows(self.fmt.plan, heads["fp"].reshape(len(heads), self.fmt.words).astype(np.uint64))
        if not self.fmt.entry_valued:
            with txn.cursor(self.store.folds) as cursor:
                cursor.putmulti(zip(seq_bytes(folds), seq_keys, strict=True))
        self.cached.keys_added(txn, keys, keys_of_ids(id_bytes))
