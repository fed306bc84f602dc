"""The write path: a batch of documents checked into a :class:`Batch`, then stored in one write transaction
with its table rows (staged, or merged at the table's turn), its ``times`` rows, the clock, and the expiry and
eviction it brings."""

from __future__ import annotations

import time as wallclock
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cached import Cached
from .expiry import Expiry
from .keys import TableKeys, run_ranks
from .lookup import Lookup
from .staging import Staging
from .store import (
    META_CLOCK,
    META_CLOCK_WINDOW,
    META_COUNT,
    META_KEYED_WRITES,
    META_NEXT_MERGE,
    META_NEXT_SEQ,
    NO_TOPIC,
    U64,
    IndexStorageError,
    Store,
    keys_of_ids,
    origin_keys,
    seq_bytes,
    time_buckets,
)
from .undo import Undo, UndoRecords

__all__ = ["CLOCK_WINDOW", "REWRITE_ROUNDS", "Batch", "Writes"]

REWRITE_ROUNDS = 4
"""A table merges every run into one only in every fourth round of merge turns (which of the four by its number),
its rows staged meanwhile: the tables, grown alike, would otherwise all do it within the same round."""
CLOCK_WINDOW = 1001
"""Entries whose median event time is the clock expiry runs by: a few entries stamped far ahead (a producer's
clock years off) move it nowhere, where the newest time would expire everything stored before them."""


@dataclass(frozen=True)
class Batch:
    """Documents to store, row for row: ids (and their UTF-8 bytes), fingerprints, event times, payloads padded to
    the index's width, origins (topic, partition, offset) or None, and their table keys."""

    ids: list[str]
    id_bytes: list[bytes]
    fps: np.ndarray
    times: np.ndarray
    payloads: np.ndarray
    origins: list[tuple[str, int, int] | None]
    keys: TableKeys | None

    @classmethod
    def checked(
        cls,
        lookup: Lookup,
        ids: Sequence[str],
        fps: np.ndarray,
        times: Sequence[float] | np.ndarray | None,
        payloads: Sequence[bytes] | np.ndarray | None,
        origins: Sequence[tuple[str, int, int] | None] | None,
        keys: TableKeys | None,
    ) -> Batch:
        """The batch of these arguments, each checked against the others and the index's format (ValueError)."""
        payload_bytes = lookup.fmt.payload_bytes
        fps = lookup.checked(fps)
        n = len(fps)
        ids = list(ids)
        if len(ids) != n:
            raise ValueError(f"{len(ids)} ids for {n} fingerprints")
        try:
            id_bytes = list(map(str.encode, ids))
        except TypeError:
            bad = [i for i, x in enumerate(ids) if not isinstance(x, str)]
            raise ValueError(f"ids must be strings; rows {bad[:10]} are not") from None
        except UnicodeEncodeError:
            # Encoding with replacement changes exactly the ids that hold lone surrogates.
            bad = [i for i, x in enumerate(ids) if x.encode(errors="replace").decode() != x]
            raise ValueError(f"ids must be valid Unicode; rows {bad[:10]} hold lone surrogates") from None
        if n and min(map(len, id_bytes)) == 0:
            raise ValueError(
                f"ids must be non-empty; rows {[i for i, b in enumerate(id_bytes) if not b][:10]} are empty"
            )
        if times is None:
            times = np.full(n, wallclock.time())
        times = np.asarray(times, dtype=np.float64).reshape(-1)
        if len(times) != n or not np.isfinite(times).all():
            raise ValueError("times must be one finite event time per fingerprint")
        payload_rows = np.zeros((n, payload_bytes), dtype=np.uint8)
        if payloads is not None:
            if isinstance(payloads, np.ndarray):
                if payloads.shape != (n, payload_bytes):
                    raise ValueError(f"payloads must have shape ({n}, {payload_bytes}), got {payloads.shape}")
                payload_rows[:] = payloads
            else:
                payloads = list(payloads)
                too_long = [i for i, p in enumerate(payloads) if len(p) > payload_bytes]
                if len(payloads) != n or too_long:
                    raise ValueError(f"need {n} payloads of at most {payload_bytes} bytes (bad rows {too_long[:10]})")
                for i, p in enumerate(payloads):
                    payload_rows[i, : len(p)] = np.frombuffer(bytes(p), dtype=np.uint8)
        origins = list(origins) if origins is not None else [None] * n
        if len(origins) != n:
            raise ValueError(f"{len(origins)} origins for {n} fingerprints")
        return cls(ids, id_bytes, fps, times, payload_rows, origins, lookup.table_keys(fps, keys))

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def table_keys(self) -> TableKeys:
        if self.keys is None:
            raise ValueError("these rows of a batch were taken without their table keys")
        return self.keys

    def subset(self, rows: np.ndarray, *, keyed: bool = True) -> Batch:
        """These rows alone; with their table keys only if ``keyed`` (taking those reads every table's rows)."""
        at = rows.tolist()
        return Batch(
            [self.ids[i] for i in at],
            [self.id_bytes[i] for i in at],
            self.fps[rows],
            self.times[rows],
            self.payloads[rows],
            [self.origins[i] for i in at],
            self.table_keys.subset(rows) if keyed else None,
        )


@dataclass(frozen=True)
class _Rows:
    """Table rows of stored entries: their ``keys``, which of them are ``placed`` (stored: keyed, with room in
    their key), and the entry keys ``seqs`` of the rows of ``keys``, row for row."""

    keys: TableKeys
    seqs: np.ndarray
    placed: np.ndarray


def _last_of_each_id(ids: list[str], start: int, end: int) -> np.ndarray:
    """Rows ``start``..``end`` of a batch, of each id there only the last: it wins, like a re-add in a later batch."""
    part = ids[start:end]
    if len(set(part)) == len(part):
        return np.arange(start, end)
    last = {x: i for i, x in enumerate(part)}
    return start + np.array(sorted(last.values()), dtype=np.intp)


class Writes:
    """Stores batches in one store."""

    def __init__(
        self,
        store: Store,
        cached: Cached,
        lookup: Lookup,
        staging: Staging,
        expiry: Expiry,
        undo: UndoRecords,
        *,
        max_age: float | None,
        max_entries: int | None,
        key_capacity: int | None,
    ) -> None:
        self.store = store
        self.fmt = store.fmt
        self.cached = cached
        self.lookup = lookup
        self.staging = staging
        self.expiry = expiry
        self.undo = undo
        self.max_age = max_age
        self.max_entries = max_entries
        self.key_capacity = key_capacity

    def add(self, txn: Any, batch: Batch, parts: Sequence[tuple[int, Mapping[tuple[str, int], int] | None]]) -> None:
        """Store a batch (a re-added id replaces its entry) in consecutive parts, given as (end row, source
        offsets after it), each as a batch of its own: its entries, undo record, clock, expiry and source offsets,
        so that a rollback to the offsets between two parts undoes the later ones whole. On an entry-valued index
        the table rows of every part are staged or merged together, with the last part's entries, as one batch's:
        each table's work is paid once, not once a part (until then nothing reads them, and the rows of an entry
        that a later part replaces or evicts stay until a sweep as they would have). A fold-valued table's rows go
        with their part, since an entry that a later part replaces or evicts takes its folds' rows with it."""
        ends = [end for end, _ in parts]
        part_rows = [_last_of_each_id(batch.ids, start, end) for start, end in zip([0, *ends[:-1]], ends, strict=True)]
        rows = np.concatenate(part_rows) if part_rows else np.zeros(0, dtype=np.intp)
        together: _Rows | None = None
        if self.fmt.entry_valued and len(rows):
            keys = batch.table_keys.subset(rows)
            # Placed before anything of the batch is stored: the rows its keys held when looked up count.
            first_seq = self.store.counter(txn, META_NEXT_SEQ)
            together = _Rows(
                keys, np.arange(first_seq, first_seq + len(rows), dtype=np.uint64), self._placed(txn, keys)
            )
        last = max((at for at, part in enumerate(part_rows) if len(part)), default=-1)
        done = 0
        for at, (rows_of_part, (_, offsets)) in enumerate(zip(part_rows, parts, strict=True)):
            if len(rows_of_part):
                if together is not None:
                    # A batch in one part, without repeated ids (the offline mode's), is stored as it is.
                    whole = len(rows_of_part) == len(batch)
                    part = batch if whole else batch.subset(rows_of_part, keyed=False)
                    table_keys = together.keys.keys if done == 0 else together.keys.keys[:, :0]
                    # Undone with those after it, this part leaves the earlier parts' rows, stored in one turn.
                    self._add_part(txn, part, table_keys, together if at == last else None, turns_after=int(done > 0))
                else:
                    part = batch.subset(rows_of_part)
                    part_keys = part.table_keys
                    placed = self._placed(txn, part_keys)
                    seqs = self.store.counter(txn, META_NEXT_SEQ) + np.arange(len(part), dtype=np.uint64)
                    self._add_part(txn, part, part_keys.keys, _Rows(part_keys, seqs, placed))
                done += len(rows_of_part)
            if offsets:
                self.store.put_source_offsets(txn, offsets)

    def _add_part(
        self, txn: Any, batch: Batch, table_keys: np.ndarray, rows: _Rows | None, *, turns_after: int = 0
    ) -> None:
        """Store one part (ids distinct): its entries, ``table_keys`` in the key filter, and ``rows`` (this part's
        table rows, or every part's). Undone, the part leaves the merge turn as before it, ``turns_after`` on."""
        id_keys = keys_of_ids(batch.id_bytes)
        undo = Undo(
            self.store.counter(txn, META_NEXT_SEQ),
            self.store.counter(txn, META_COUNT),
            txn.get(META_CLOCK, db=self.store.meta),
            txn.get(META_CLOCK_WINDOW, db=self.store.meta),
            [],
            [],
            [],
            {},
            [],
            self.store.counter(txn, META_NEXT_MERGE) + turns_after,
            self.store.unswept(txn).astype(U64).tobytes(),
        )
        _, existing = self.lookup.entries_of_ids(txn, batch.id_bytes)
        if len(existing):
            self.expiry.remove(txn, existing, undo)
        seqs, seq_keys = self._insert_entries(txn, batch)
        # Before the next part looks its ids up.
        self.cached.keys_added(txn, table_keys, id_keys)
        if rows is not None:
            # Before the undo record: a sweep at this merge turn keeps the rows that records may restore.
            self._insert_rows(txn, rows)
        self._insert_times(txn, batch, undo, seqs, seq_keys)
        window = np.concatenate([self.store.clock_window(txn), batch.times])[-CLOCK_WINDOW:]
        txn.put(META_CLOCK_WINDOW, window.tobytes(), db=self.store.meta)
        clock = max(float(np.median(window)), self.store.clock(txn))
        txn.put(META_CLOCK, np.float64(clock).tobytes(), db=self.store.meta)
        if self.max_age is not None:
            self.expiry.expire(txn, clock - self.max_age, undo)
        if self.max_entries is not None:
            self.expiry.evict(txn, self.max_entries, undo)
        self.undo.save(txn, undo)
        # After the undo record: the rows of entries it may restore stay.
        self.expiry.sweep_hashed(txn)

    def _placed(self, txn: Any, batch_keys: TableKeys) -> np.ndarray:
        """(tables, n): which of the batch's table rows are stored: its keyed positions with room in their key."""
        placed = batch_keys.keyed_positions()
        if self.key_capacity is not None:
            placed &= self._within_capacity(txn, batch_keys)
        return placed

    def _insert_entries(self, txn: Any, batch: Batch) -> tuple[np.ndarray, list[bytes]]:
        """Store a batch's entries (ids distinct, none stored); returns their entry keys, as numbers and bytes."""
        fps, times, origins = batch.fps, batch.times, batch.origins
        n = len(fps)
        first_seq = self.store.counter(txn, META_NEXT_SEQ)
        if self.fmt.entry_valued and first_seq + n > 1 << (8 * self.fmt.entry_key_bytes):
            raise IndexStorageError(
                f"the index has given out all {1 << (8 * self.fmt.entry_key_bytes)} entry keys its tables can name; "
                "export it and import it into a new index"
            )
        seqs = np.arange(first_seq, first_seq + n, dtype=np.uint64)
        seq_keys = seq_bytes(seqs)
        head = np.zeros(n, dtype=self.fmt.record)
        head["fp"] = fps.reshape(n, self.fmt.words)
        head["time"] = times
        head["topic"] = NO_TOPIC
        head["payload"] = batch.payloads.reshape(n, self.fmt.payload_bytes)
        # Counted in C first: batches all without origins (the offline mode) or all with (the service) are
        # the common cases, and neither takes a Python step per row here.
        missing = origins.count(None)
        if missing != n:
            rows, present, present_keys = np.arange(n), origins, seq_keys
            if missing:
                kept = [i for i, origin in enumerate(origins) if origin is not None]
                rows, present, present_keys = np.array(kept), [origins[i] for i in kept], [seq_keys[i] for i in kept]
            topics, partitions, offsets = zip(*present, strict=True)
            topic_ids = self.store.topic_ids(txn, topics)
            head["topic"][rows] = topic_ids[topics[0]] if len(topic_ids) == 1 else [topic_ids[t] for t in topics]
            head["partition"][rows] = partitions
            head["offset"][rows] = offsets
            with txn.cursor(self.store.origins) as cursor:
                cursor.putmulti(zip(origin_keys(head[rows]), present_keys, strict=True))
        self.cached.entries_added(seqs, times, head["payload"].reshape(n, self.fmt.payload_bytes))
        with txn.cursor(self.store.entries) as cursor:
            cursor.putmulti(zip(seq_keys, self.fmt.records.encode(head, batch.id_bytes), strict=True), append=True)
        self.lookup.ids.add(txn, batch.id_bytes, seqs)
        self.lookup.contents.add(txn, fps.reshape(n, self.fmt.words), head["payload"], seqs)
        return seqs, seq_keys

    def _insert_times(self, txn: Any, batch: Batch, undo: Undo, seqs: np.ndarray, seq_keys: list[bytes]) -> None:
        """The ``times`` rows of a batch's stored entries, and the counts of entries given out and held."""
        times, n, first_seq = batch.times, len(seqs), int(seqs[0])
        # One row per (time bucket, batch): the batch's entry keys in that bucket as (start, stop) runs.
        buckets = time_buckets(times, self.fmt.time_bucket)
        order = np.argsort(buckets, kind="stable")
        edges = np.flatnonzero(np.diff(buckets[order])) + 1
        for bucket_rows in np.split(order, edges):
            members = seqs[bucket_rows]
            breaks = np.flatnonzero(np.diff(members) != 1) + 1
            starts = members[np.concatenate([[0], breaks])]
            stops = members[np.concatenate([breaks - 1, [len(members) - 1]])] + np.uint64(1)
            key = seq_bytes(buckets[bucket_rows[:1]])[0] + seq_keys[bucket_rows[0]]
            undo.times.setdefault(key, None)
            txn.put(key, np.stack([starts, stops], axis=1).astype(U64).tobytes(), db=self.store.times)
        self.store.put_counter(txn, META_NEXT_SEQ, first_seq + n)
        self.store.put_counter(txn, META_COUNT, self.store.counter(txn, META_COUNT) + n)

    def _insert_rows(self, txn: Any, rows: _Rows) -> None:
        """Store table rows, staged under their first entry key, or merged at their table's turn."""
        batch_keys, seqs, placed = rows.keys, rows.seqs, rows.placed
        if not self.fmt.entry_valued:
            folds = batch_keys.folds
            # Key order lets LMDB's cursor stay on the current leaf page between neighbouring puts.
            order = np.argsort(folds)
            with txn.cursor(self.store.folds) as cursor:
                cursor.putmulti(zip(seq_bytes(folds[order]), seq_bytes(seqs[order]), strict=True))
        # Rows are staged; one table in turn takes its staged rows and this batch's (see the module docstring).
        turn = self.store.counter(txn, META_NEXT_MERGE)
        turn_round, merged = divmod(turn, len(self.store.tables))
        for table in range(len(self.store.tables)):
            wanted = placed[table]
            keys = batch_keys.keys[table][wanted]
            values = (seqs[batch_keys.rows[table]] if self.fmt.entry_valued else batch_keys.values[table])[wanted]
            if table == merged and self.store.tables[table].merge_due(
                txn,
                len(self.cached.staged(txn)[table]) + len(keys),
                may_rewrite=self._may_rewrite(txn, turn_round, table),
            ):
                self._merge(txn, table, keys, values)
            else:
                self.staging.stage(txn, table, int(seqs[0]), keys, values)
        self.store.put_counter(txn, META_NEXT_MERGE, turn + 1)

    def _may_rewrite(self, txn: Any, turn_round: int, table: int) -> bool:
        """Whether the table's turn in this round may merge all its runs into one: in its own round of
        ``REWRITE_ROUNDS``, or when a sweep is due, which writes the table again anyway."""
        if turn_round % REWRITE_ROUNDS == table % REWRITE_ROUNDS:
            return True
        return self.fmt.entry_valued and self.expiry.sweep_due(txn, table)

    def _merge(self, txn: Any, table: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Put a table's staged rows and a batch's rows of it into the table, in key order."""
        staged = self.cached.staged(txn)
        old_keys, old_values = staged[table].keys, staged[table].values
        keys, values = np.concatenate([old_keys, keys]), np.concatenate([old_values, values])
        if self.fmt.entry_valued and self.expiry.sweep_due(txn, table):
            self.expiry.sweep(txn, table, keys, values)
        else:
            order = np.argsort(keys, kind="stable")
            self.store.tables[table].insert(txn, keys[order], values[order])
            self.cached.mirror_inserted(txn, table, keys[order], values[order])
        if len(old_keys):
            self.staging.unstage(txn, table)
            staged[table] = staged[table].emptied()
            self.cached.staged_changed()

    def _within_capacity(self, txn: Any, batch_keys: TableKeys) -> np.ndarray:
        """(tables, n): whether each table row's key still has room for it, in the order ``batch_keys`` holds
        them (each table's keys ascending, each key's rows in stream order): the first of them up to
        ``key_capacity`` rows of that key, counting those stored or staged (a removed entry's row counts until its
        table's sweep). A hot key keeps its first documents and takes no more. All tables at once: only the
        counts held are read table by table."""
        tables, n = batch_keys.keys.shape
        starts = np.flatnonzero(batch_keys.runs.ravel())
        looked_up = batch_keys.held
        if looked_up is not None and looked_up.keyed_writes == self.store.counter(txn, META_KEYED_WRITES):
            held = looked_up.counts.ravel()[starts]
        else:
            held = self._runs_held(txn, batch_keys, starts)
        run_lengths = np.diff(np.append(starts, tables * n))
        room = run_ranks(starts, tables * n) + np.repeat(held, run_lengths) < self.key_capacity
        return room.reshape(tables, n)

    def _runs_held(self, txn: Any, batch_keys: TableKeys, starts: np.ndarray) -> np.ndarray:
        """Rows the key of each run (its first flat position in ``starts``) holds, merged and staged."""
        tables, n = batch_keys.keys.shape
        run_keys = batch_keys.keys.ravel()[starts]
        # Most keys of kept documents were never added (the key filter proves it): they hold no row.
        key_filter = self.cached.trusted_key_filter(txn)
        held_any = np.flatnonzero(
            np.ones(len(starts), dtype=bool) if key_filter is None else key_filter.may_contain(starts // n, run_keys)
        )
        table_bounds = np.searchsorted(held_any, np.searchsorted(starts, np.arange(tables + 1) * n)).tolist()
        held = np.zeros(len(starts), dtype=np.int64)
        for table in range(tables):
            low, high = table_bounds[table], table_bounds[table + 1]
            if low < high:
                runs = held_any[low:high]
                held[runs] = self._rows_held(txn, table, run_keys[runs])
        return held

    def _rows_held(self, txn: Any, table: int, unique_keys: np.ndarray) -> np.ndarray:
        """Rows each of these keys (ascending, distinct) holds in ``table``, merged and staged."""
        mirror = self.cached.table_mirror(txn)
        mirrored = mirror.tables[table] if mirror is not None else None
        if mirrored is not None:
            low, high = mirrored.bounds(unique_keys)
            held = high - low
        else:
            owners, _ = self.store.tables[table].read(txn, unique_keys)
            held = np.bincount(owners, minlength=len(unique_keys))
        staged = self.cached.staged(txn)[table]
        if len(staged):
            low, high = staged.bounds(unique_keys)
            held = held + (high - low)
        return held
