"""Lookup: the stored entries within the radius of a batch of fingerprints, found through the tables' rows
(merged, staged, or mirrored in memory), and the entries' records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property, partial
from typing import Any

import numpy as np

from .cached import Cached
from .contents import Contents, NoContents
from .ids import Ids
from .keys import HeldRows, TableKeys, most_shared, packed, table_keys
from .mirror import fetched_rows
from .packed_ids import PackedIds
from .plan import scatter_bits
from .record import origins_of
from .sorted_rows import expand_ranges, run_starts
from .store import META_KEYED_WRITES, NO_TOPIC, U64, Store, id_hashes, keys_of_ids, seq_bytes

__all__ = ["Candidates", "EntryRecords", "Lookup", "SearchResult"]


@dataclass(frozen=True)
class SearchResult:
    """Flat matches, sorted by (row, distance, insertion order): query row, entry key, Hamming distance."""

    rows: np.ndarray
    entries: np.ndarray
    distances: np.ndarray

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class Candidates:
    """Stored entries found for query rows, sorted by (row, entry key), each with how many tables it shares
    with its row: a decision verifies a row's candidates sharing the most first, on the times and payloads
    :meth:`Lookup.times_and_payloads` gives, and reads the rest of a record only for the few that pass."""

    rows: np.ndarray
    entries: np.ndarray
    shared: np.ndarray
    held: HeldRows | None = None
    """The rows each query key holds, position for position in the queries' table keys (entry-valued indexes)."""

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class EntryRecords:
    """Stored entries in bulk, in the order asked for (entry keys that no longer exist are skipped).
    ``origin_rows`` holds each entry's (topic id, partition, offset), named by ``topic_names``."""

    entries: np.ndarray
    ids: PackedIds
    fingerprints: np.ndarray
    times: np.ndarray
    payloads: np.ndarray
    origin_rows: np.ndarray
    topic_names: Mapping[int, str]

    @cached_property
    def origins(self) -> list[tuple[str, int, int] | None]:
        """Each entry's (topic, partition, offset), None for entries stored without one. Built on first use:
        lookups read thousands of records and need none of them."""
        rows = self.origin_rows
        return [
            None if t == NO_TOPIC else (self.topic_names[t], p, o)
            for t, p, o in zip(rows["topic"].tolist(), rows["partition"].tolist(), rows["offset"].tolist(), strict=True)
        ]

    def origin(self, row: int) -> tuple[str, int, int] | None:
        """One entry's (topic, partition, offset), None when stored without one."""
        topic, partition, offset = self.origin_rows[row].tolist()
        return None if topic == NO_TOPIC else (self.topic_names[topic], partition, offset)


class Lookup:
    """Search and records over one open store, through its copies in memory, and its entries by id."""

    def __init__(
        self, store: Store, cached: Cached, ids: Ids, contents: Contents | NoContents, key_capacity: int | None = None
    ) -> None:
        self.store = store
        self.key_capacity = key_capacity
        self.cached = cached
        self.ids = ids
        self.contents = contents
        self.fmt = store.fmt

    def checked(self, fps: np.ndarray) -> np.ndarray:
        fps = np.asarray(fps)
        if fps.ndim == 1 and self.fmt.words == 1:
            fps = fps.reshape(-1, 1)
        if fps.ndim != 2 or fps.shape[1] != self.fmt.words:
            raise ValueError(
                f"fingerprints must have shape (n, {self.fmt.words}) for {self.fmt.plan.bits}-bit index, "
                f"got {fps.shape}"
            )
        if fps.dtype != np.uint64:
            raise ValueError(f"fingerprints must be uint64, got {fps.dtype}")
        return np.ascontiguousarray(fps)

    def table_keys(self, fps: np.ndarray, keys: TableKeys | None) -> TableKeys:
        """``keys`` when given (computed elsewhere for these ``fps``, e.g. by a signing worker), checked
        against the stored plan; else computed here."""
        if keys is None:
            return table_keys(self.fmt.plan, fps)
        if not keys.plan.same_lookup(self.fmt.plan):
            raise ValueError("table keys of another plan than this index's")
        if len(keys) != len(fps):
            raise ValueError(f"table keys for {len(keys)} rows do not fit {len(fps)} fingerprints")
        return keys

    def search(
        self,
        txn: Any,
        fps: np.ndarray,
        min_time: float | None,
        keys: TableKeys | None = None,
        max_candidates: int | None = None,
    ) -> tuple[SearchResult, EntryRecords | None]:
        near, records = self._near(txn, fps, min_time, keys, max_candidates)
        if near is None:
            return SearchResult(np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64)), records
        rows_q, seqs, distances, _ = near
        word = packed([rows_q, distances, seqs]) if len(rows_q) else None
        order = np.lexsort((seqs, distances, rows_q)) if word is None else np.argsort(word[0])
        return SearchResult(rows_q[order], seqs[order], distances[order]), records

    def _near(
        self, txn: Any, fps: np.ndarray, min_time: float | None, keys: TableKeys | None, max_candidates: int | None
    ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None, EntryRecords | None]:
        """The (query row, entry key) pairs within the radius (and not older than ``min_time``), unordered, each
        with its distance and the tables it shares; and the records read to tell (None: none were)."""
        found, _ = self._found(txn, fps, keys, max_candidates)
        if found is None:
            return None, None
        rows_q, seqs, folds, shared = found
        radius = self.fmt.plan.radius
        records = None
        if self.fmt.words == 1:
            distances = np.bitwise_count(folds ^ fps[rows_q, 0]).astype(np.int64)
        if self.fmt.words > 1 or min_time is not None:
            records = self.records(txn, np.unique(seqs))
            slot, present = _located(records, seqs)
            rows_q, seqs, shared, slot = rows_q[present], seqs[present], shared[present], slot[present]
            if self.fmt.words == 1:
                distances = distances[present]
            else:
                distances = np.bitwise_count(records.fingerprints[slot] ^ fps[rows_q]).sum(axis=1).astype(np.int64)
            keep = distances <= radius
            if min_time is not None:
                keep &= records.times[slot] >= min_time
            rows_q, seqs, distances, shared = rows_q[keep], seqs[keep], distances[keep], shared[keep]
        return (rows_q, seqs, distances, shared), records

    def candidates(
        self, txn: Any, fps: np.ndarray, keys: TableKeys | None = None, max_candidates: int | None = None
    ) -> Candidates:
        """The stored entries within the radius of each query (as :meth:`search`), without their records."""
        none = Candidates(np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64))
        if not self.fmt.entry_valued:
            near, _ = self._near(txn, fps, None, keys, max_candidates)
            if near is None:
                return none
            rows, entries, _, shared = near
            word = packed([rows, entries]) if len(rows) else None
            order = np.lexsort((entries, rows)) if word is None else np.argsort(word[0])
            return Candidates(rows[order], entries[order], shared[order])
        found, held = self._found(txn, fps, keys, max_candidates)
        if found is None:
            return replace(none, held=held)
        rows, entries, _, shared = found
        return Candidates(rows, entries, shared, held)

    def times_and_payloads(self, txn: Any, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each of these entry keys (any order, repeated or not): whether it is still stored (its table rows
        can outlive it), its event time and its payload; on an entry-valued index through the writer's cache of
        them."""
        fetch = partial(self._times_and_payloads, txn)
        mirror = self.cached.read_mirror(txn) if self.fmt.entry_valued else None
        return fetched_rows(entries, fetch) if mirror is None else mirror.records.read(entries, fetch)

    def _times_and_payloads(self, txn: Any, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Of these entry keys (ascending, distinct), those stored, with their event times and payloads."""
        held, head, _ = self.store.stored_records(txn, entries)
        return held, head["time"].astype(np.float64), head["payload"].reshape(len(head), self.fmt.payload_bytes)

    def _found(
        self, txn: Any, fps: np.ndarray, keys: TableKeys | None, max_candidates: int | None
    ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None, HeldRows | None]:
        """The (query row, entry key) pairs the tables name, by row, each with what its table row held (the entry
        key, or on a fold-valued index the entry's 64-bit fold, within the radius) and how many tables named it,
        None when none; and, on an entry-valued index, the rows each position's key holds."""
        n = len(fps)
        if n == 0:
            return None, None
        radius = self.fmt.plan.radius
        batch_keys = self.table_keys(fps, keys)
        tables = len(self.store.tables)
        probes = batch_keys.runs & batch_keys.keyed_positions()
        # Every table's probes as flat (table, position) indices, table after table: the work around the reads
        # runs once over all tables, where a loop per table pays numpy's call overhead 32 times.
        flat = np.flatnonzero(probes.ravel())
        key_filter = self.cached.trusted_key_filter(txn)
        if key_filter is not None and len(flat):
            flat = flat[key_filter.may_contain(flat // n, batch_keys.keys.ravel()[flat])]
        probed = batch_keys.keys.ravel()[flat]
        table_bounds = np.searchsorted(flat, np.arange(tables + 1) * n).tolist()
        staged = self.cached.staged(txn)
        mirror = self.cached.table_mirror(txn)
        found_probes, found_values = [], []
        for table, stored_table in enumerate(self.store.tables):
            low, high = table_bounds[table], table_bounds[table + 1]
            if low == high:
                continue
            table_probed = probed[low:high]
            mirrored = mirror.tables[table] if mirror is not None else None
            owners, stored = (
                mirrored.read(table_probed) if mirrored is not None else stored_table.read(txn, table_probed)
            )
            if len(owners):
                found_probes.append(low + owners)
                found_values.append(stored)
            if len(staged[table]):
                staged_probe, staged_values = staged[table].read(table_probed)
                if len(staged_probe):
                    found_probes.append(low + staged_probe)
                    found_values.append(staged_values)
        probe_of = np.concatenate(found_probes) if found_probes else np.zeros(0, np.intp)
        # Only entry-valued tables stay as a lookup read them until a batch adds keys (see ``HeldRows``).
        held = self._held(txn, batch_keys, flat, probe_of) if self.fmt.entry_valued else None
        # Nothing found (probes can pass the key filter on a removed row's bit, or miss the staged rows).
        if not found_probes:
            return None, held
        stored = np.concatenate(found_values)
        found_at = flat[probe_of]
        # Each stored row pairs with every batch row of its key's run (usually one): rows of a key that several
        # batch rows share pair again with each further one (more_at), through their row (source).
        run_ends = batch_keys.run_ends()
        shared = np.flatnonzero((run_ends[flat] - flat > 1)[probe_of])
        more_at, source = expand_ranges(found_at[shared] + 1, run_ends[found_at[shared]])
        source = shared[source]
        if self.fmt.entry_valued:
            # The rows name their entries, and no radius cuts: every candidate goes on to its record.
            near_at, named = np.concatenate([found_at, more_at]), np.concatenate([stored, stored[source]])
            if held is not None and max_candidates is not None and self.key_capacity is not None:
                followed = ~batch_keys.unfollowed(held.counts, self.key_capacity)[near_at]
                near_at, named = near_at[followed], named[followed]
        else:
            # Candidates outside the radius go before anything else is built for them (or copied).
            values = batch_keys.values.ravel()
            near = np.flatnonzero(np.bitwise_count(stored ^ values[found_at]) <= radius)
            near_more = np.flatnonzero(np.bitwise_count(stored[source] ^ values[more_at]) <= radius)
            near_at = np.concatenate([found_at[near], more_at[near_more]])
            if not len(near_at):
                return None, held
            rows = np.concatenate([near, source[near_more]])
            named = self._folds_from_found(near_at // n, probed[probe_of[rows]], stored[rows])
        qi = batch_keys.rows.ravel()[near_at]
        qi, named, shared = _distinct_pairs(qi, named)
        if max_candidates is not None and self.fmt.entry_valued:
            best = most_shared(qi, named, shared, max_candidates)
            best = best[batch_keys.well_shared(qi[best], shared[best])]
            qi, named, shared = qi[best], named[best], shared[best]
        if self.fmt.entry_valued:
            return (qi, named, named, shared), held
        unique_folds, inverse = np.unique(named, return_inverse=True)
        with txn.cursor(self.store.folds) as cursor:
            raw = cursor.getmulti(seq_bytes(unique_folds), dupdata=True, dupfixed_bytes=8, keyfixed=True)
        rows = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 16)
        pair, ri = _group_expand(unique_folds, inverse, rows[:, :8].copy().view(U64).ravel().astype(np.uint64))
        rows_q = qi[pair]
        seqs = rows[ri, 8:].copy().view(U64).ravel().astype(np.uint64)
        return (rows_q, seqs, named[pair], shared[pair]), held

    def _held(self, txn: Any, batch_keys: TableKeys, probed: np.ndarray, probe_of: np.ndarray) -> HeldRows:
        """The rows each position's key holds, from the rows found for the probed positions (the runs' first
        positions; a run's key probed or not, as the key filter proves it absent)."""
        runs = batch_keys.runs.ravel()
        at_probes = np.zeros(len(runs), dtype=np.int64)
        at_probes[probed] = np.bincount(probe_of, minlength=len(probed))
        counts = at_probes[np.flatnonzero(runs)][np.cumsum(runs) - 1]
        return HeldRows(counts.reshape(batch_keys.keys.shape), self.store.counter(txn, META_KEYED_WRITES))

    def _folds_from_found(self, table_of: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``_folds_from_rows`` of rows from several tables (``table_of`` each)."""
        if self.fmt.words > 1:
            return values
        folds = np.empty(len(values), dtype=np.uint64)
        order = np.argsort(table_of, kind="stable")
        bounds = np.searchsorted(table_of[order], np.arange(len(self.store.tables) + 1)).tolist()
        for table in range(len(self.store.tables)):
            rows = order[bounds[table] : bounds[table + 1]]
            if len(rows):
                folds[rows] = self._folds_from_rows(table, keys[rows], values[rows])
        return folds

    def _folds_from_rows(self, table: int, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Rebuild the 64-bit folds of table rows (the inverse of the key/value split)."""
        if self.fmt.words > 1:
            return values
        return scatter_bits(keys, self.fmt.plan.tables[table]) | scatter_bits(values, self.fmt.plan.value_bits(table))

    def entries_of_ids(self, txn: Any, id_bytes: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """The position in ``id_bytes`` of each stored id (ascending), and its entry key: the ids are asked for
        only where the key filter does not prove them new."""
        key_filter = self.cached.trusted_key_filter(txn)
        if key_filter is None:
            return self.ids.find(txn, id_bytes)
        maybe = np.flatnonzero(key_filter.may_hold_ids(id_hashes(keys_of_ids(id_bytes))))
        at, seqs = self.ids.find(txn, [id_bytes[i] for i in maybe.tolist()])
        return maybe[at], seqs

    def fetch(self, txn: Any, seqs: np.ndarray, *, payloads: bool = True) -> tuple[np.ndarray, np.ndarray, PackedIds]:
        """Records of the given entry keys, sorted by key (missing keys skipped): keys, heads, ids (see
        ``RecordLayout.decode`` for ``payloads``)."""
        return self.store.stored_records(txn, np.unique(np.asarray(seqs, dtype=np.uint64)), payloads=payloads)

    def records(self, txn: Any, seqs: np.ndarray, *, payloads: bool = True) -> EntryRecords:
        """Records of the given entry keys, sorted by key (missing keys skipped); with ``payloads=False`` their
        payloads are not read (an empty column)."""
        entries, head, ids = self.fetch(txn, seqs, payloads=payloads)
        topics = self.store.topic_names(txn) if len(head) and (head["topic"] != NO_TOPIC).any() else {}
        payload_column = head["payload"].reshape(len(head), self.fmt.payload_bytes)
        return EntryRecords(
            entries,
            ids,
            head["fp"].reshape(len(head), self.fmt.words).astype(np.uint64),
            head["time"].astype(np.float64),
            (payload_column if payloads else payload_column[:, :0]).copy(),
            origins_of(head),
            topics,
        )

    def records_of(self, txn: Any, entries: np.ndarray, *, payloads: bool = True) -> tuple[np.ndarray, EntryRecords]:
        """The records of these entry keys: the position in ``entries`` of each one still stored (ascending),
        and its record, row for row (see ``records`` for ``payloads``)."""
        records = self.records(txn, entries, payloads=payloads)
        slot, present = _located(records, entries)
        return np.flatnonzero(present), _reordered(records, slot[present])

    def grouped(self, n: int, result: SearchResult, records: EntryRecords) -> list[list[tuple[str, int]]]:
        slot = np.searchsorted(records.entries, result.entries)
        out: list[list[tuple[str, int]]] = [[] for _ in range(n)]
        for row, s, distance in zip(result.rows.tolist(), slot.tolist(), result.distances.tolist(), strict=True):
            out[row].append((records.ids[s], distance))
        return out


def _group_expand(
    unique_keys: np.ndarray, inverse: np.ndarray, found_keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Join queries to found rows sharing their key, without Python loops.

    ``unique_keys`` are the sorted distinct query keys, ``inverse`` maps each query to its key, and
    ``found_keys`` are the keys of the rows getmulti returned: grouped by key, in ``unique_keys`` order.
    Returns (query index, found row index) for every query x row pair with the same key.
    """
    if not len(found_keys):
        return np.zeros(0, np.intp), np.zeros(0, np.intp)
    group_starts = run_starts(found_keys)
    sizes = np.diff(np.append(group_starts, len(found_keys)))
    slot = np.searchsorted(unique_keys, found_keys[group_starts])
    if len(unique_keys) == len(inverse):
        # Every query has a key of its own (the usual case): each found row belongs to one query.
        query_of_key = np.empty(len(inverse), dtype=np.intp)
        query_of_key[inverse] = np.arange(len(inverse))
        return query_of_key[np.repeat(slot, sizes)], np.arange(len(found_keys))
    counts = np.zeros(len(unique_keys), dtype=np.intp)
    starts = np.zeros(len(unique_keys), dtype=np.intp)
    counts[slot], starts[slot] = sizes, group_starts
    per_query = counts[inverse]
    total = int(per_query.sum())
    queries = np.repeat(np.arange(len(inverse)), per_query)
    first = np.repeat(starts[inverse] - (np.cumsum(per_query) - per_query), per_query)
    return queries, first + np.arange(total)


def _distinct_pairs(rows: np.ndarray, named: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (row, named) pairs, sorted, and how many times each came (through how many tables)."""
    if not len(rows):
        return rows.astype(np.int64), named, np.zeros(0, dtype=np.int64)
    word = packed([rows, named])
    if word is not None:
        pairs, shared = np.unique(word[0], return_counts=True)
        named_bits = word[1][1]
        rows_of = (pairs >> pairs.dtype.type(named_bits)).astype(np.int64)
        return rows_of, (pairs & pairs.dtype.type((1 << named_bits) - 1)).astype(np.uint64), shared
    order = np.lexsort((named, rows))
    rows, named = rows[order], named[order]
    first = np.concatenate([[True], (rows[1:] != rows[:-1]) | (named[1:] != named[:-1])])
    shared = np.diff(np.append(np.flatnonzero(first), len(first)))
    return rows[first].astype(np.int64), named[first], shared


def _located(records: EntryRecords, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``entries`` is among the records (sorted by entry key), and whether it is there."""
    slot = np.searchsorted(records.entries, entries)
    present = slot < len(records.entries)
    present[present] = records.entries[slot[present]] == entries[present]
    return slot, present


def _reordered(records: EntryRecords, order: np.ndarray) -> EntryRecords:
    return EntryRecords(
        records.entries[order],
        records.ids.take(order),
        records.fingerprints[order],
        records.times[order],
        records.payloads[order],
        records.origin_rows[order],
        records.topic_names,
    )
