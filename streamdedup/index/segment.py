"""The persistent LMDB segment index: Hamming-near lookup over many tables, bounded, crash-safe.

Layout (one LMDB environment, names in ``streamdedup.names``):

- ``table-<i>``: rows of key = the plan's key bits of the fingerprint, value = the rest of the 64-bit fold
  (on 64-bit fingerprints the fingerprint itself minus its key bits), so a bucket reads as one packed array
  and a candidate is checked by one XOR + popcount. Where that check cannot reject anything (fingerprints
  wider than 64 bits with no radius, the segmented default), the value is the entry's sequence number
  instead, and ``folds`` stays empty: a lookup goes straight to the records. Fold-valued tables pack each
  key's values into one LMDB value (the ``buckets`` layout of ``table``, format 4); entry-valued tables, and
  every table of an index written before format 4, are dupsort + dupfixed databases (``rows``).
- ``table-staged``: table rows not yet merged into their table, one packed array per (table, batch). A
  batch stages its rows and merges one table's staged rows into that table, in turn (a table of buckets
  lets its turn pass until it has about four staged rows per bucket); lookups read the staged rows from a
  sorted copy in memory. A random insert dirties a whole B-tree page, which every commit
  writes out again: inserting a batch into every table rewrote nearly all table pages of a small index per
  batch, while a merge of many batches into one table rewrites that table's pages once for all of them.
- Removal deletes a fold-valued table's rows that no surviving entry shares. An entry-valued table keeps a
  removed entry's rows, staged or merged (lookups read every candidate's record and drop those whose entry is
  gone), and is swept at its merge turn once its removals since the last sweep reach its live entries times
  1 to 2 (staggered over the tables): rewritten in key order with LMDB's append mode, its staged rows and the
  batch's merged in, the rows of removed entries left out. Deleting them at once dirtied a random page of every
  table per entry, which each commit wrote out again (the README has the figures). The meta counter
  ``unswept`` holds each table's removals since its last sweep.
- ``folds`` (dupsort + dupfixed): fold -> entry sequence numbers (table values name a fold, not an entry,
  which keeps tables at ~8 bytes per entry on 64-bit fingerprints).
- ``entries``: sequence (big-endian, monotonic, appended) -> record (fingerprint, event time, origin,
  payload, id). ``ids``: id -> sequence (module ``ids``: hashed sorted runs, keyed by the id before format 8;
  the meta counter ``unswept_ids`` holds the rows of removed entries since their last sweep). ``contents``: hash
  of fingerprint and payload -> sequence, for the entries stored under too few table keys for their exact copies
  to find them (module ``contents``, from format 9; the same runs, counter ``unswept_contents``). ``times``: (time
  bucket, first sequence of a batch) -> that batch's sequences in the bucket as (start, stop) runs: one row per
  batch, and expiry and eviction read only the oldest rows. ``origins``: (topic, partition, offset) -> sequence,
  for rollback. ``sources``: (topic, partition) -> next offset. ``topics``: topic name -> small id. ``meta``:
  plan, format, counters.
- ``undo``: per batch that stored entries, the last ``UNDO_BATCHES`` of them, what it changed beyond its own
  entries: the records it removed (expiry, ``max_entries`` eviction, a re-added id), the ``times`` rows it
  deleted or trimmed, and the clock, its window and the count before it. ``rollback`` undoes the newest
  batches whole with them, so a replay finds the index exactly as the first run did.
- ``key-filter.npz`` beside the environment: the last writer's key filter, saved when it closed (see
  ``key_filter``), for the next writer to load instead of rebuilding it.

``SegmentIndex`` owns the environment and its transactions, and hands each to the parts, one idea each: the
format and its compatibility (``format``), the databases and their key encodings (``store``), what is cached in
memory and when it is fresh (``cached``), lookup (``lookup``), the write path (``writes``, ``staging``), and
removal, expiry, sweeps and rollback (``expiry``, ``undo``), and entries by id (``ids``) and by content
(``contents``), both as ``hashed_runs``.

Every batch is one write transaction: the entries, their table rows and the source offsets commit together
or not at all, so a crash at any moment leaves exactly the committed batches.
"""

from __future__ import annotations

import gc
import math
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar

import lmdb
import numpy as np

from .. import names
from ..settings import IndexSettings
from .cached import Cached
from .contents import Contents, NoContents, content_index
from .expiry import Expiry
from .format import IndexFormat, mark_current, planned
from .hashed_runs import HashedRuns
from .ids import HashedIds, Ids, id_index
from .keys import TableKeys
from .lookup import Candidates, EntryRecords, Lookup, SearchResult
from .mirror import RecordCache
from .plan import IndexPlan, PlanError
from .record import BYTES_PAYLOAD, SKETCH_PAYLOAD
from .staging import Staging
from .store import META_COUNT, U64, IndexStorageError, Store, bucket_start, open_db
from .table import SortedRuns
from .transactions import begin_read
from .undo import UndoRecords
from .writes import Batch, Writes

__all__ = [
    "BYTES_PAYLOAD",
    "SKETCH_PAYLOAD",
    "STORAGE_ERRORS",
    "Candidates",
    "EntryRecords",
    "IndexStorageError",
    "SearchResult",
    "SegmentIndex",
    "planned",
]

_T = TypeVar("_T")


STORAGE_ERRORS: tuple[type[Exception], ...] = (IndexStorageError, lmdb.Error)
"""Errors of the index's storage, whatever the batch holds: no document of it is to blame."""


class SegmentIndex:
    """Hamming-near lookup of fingerprints, persistent in LMDB. One writer process, any number of readers."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        bits: int | None = 64,
        radius: int | None = 3,
        *,
        expected_entries: int = 1_000_000,
        max_age: float | None = None,
        max_entries: int | None = None,
        payload_bytes: int | None = 0,
        plan: IndexPlan | None = None,
        max_tables: int = 16,
        time_bucket: float = 3600.0,
        map_size: int = 1 << 30,
        max_map_size: int | None = None,
        sync: bool = True,
        readonly: bool = False,
        mirror_bytes: int = 320 << 20,
        signing: str | None = None,
        key_capacity: int | None = None,
        payload_kind: str = BYTES_PAYLOAD,
    ) -> None:
        self.path = Path(path)
        self.key_capacity = key_capacity
        self.sync = sync
        self._closed = False
        self.max_age = max_age
        self.max_entries = max_entries
        self.readonly = readonly
        self._max_map_size = max_map_size
        self._mirror_bytes = mirror_bytes
        if not readonly:
            self.path.mkdir(parents=True, exist_ok=True)
        elif not (self.path / "data.mdb").exists():
            raise FileNotFoundError(f"no index at {self.path}")
        self.env = lmdb.open(
            str(self.path),
            map_size=map_size,
            max_dbs=64,
            readonly=readonly,
            sync=sync,
            metasync=sync,
            readahead=False,
            subdir=True,
        )
        try:
            meta = open_db(self.env, names.INDEX_DB_META, readonly=readonly)
            self.fmt = fmt = IndexFormat.opened(
                self.env,
                self._read,
                meta,
                self.path,
                readonly=readonly,
                bits=bits,
                radius=radius,
                expected_entries=expected_entries,
                payload_bytes=payload_bytes,
                plan=plan,
                max_tables=max_tables,
                time_bucket=time_bucket,
                signing=signing,
                payload_kind=payload_kind,
            )
            self.plan = fmt.plan
            self.payload_bytes = fmt.payload_bytes
            self.time_bucket = fmt.time_bucket
            self.signing = fmt.signing
            self.bits = fmt.plan.bits
            self.radius = fmt.plan.radius
            self.words = fmt.words
            self._open_parts()
        except BaseException:
            self.env.close()
            raise

    @classmethod
    def from_settings(
        cls,
        settings: IndexSettings,
        *,
        bits: int | None,
        payload_bytes: int | None,
        path: str | os.PathLike[str] | None = None,
        readonly: bool = False,
        segments: int = 1,
        signing: str | None = None,
        key_capacity: int | None = None,
        payload_kind: str = BYTES_PAYLOAD,
    ) -> SegmentIndex:
        """The index an ``index:`` config section describes (at ``settings.path`` unless ``path`` is given);
        ``segments`` > 1 (a segmented fingerprint) takes one table per segment. ``signing`` names how fingerprints
        and payloads are made (recorded in a new index; an existing one that recorded another refuses)."""
        # Classic plans are left to the constructor, which keeps an existing index's planning size.
        segmented = segments > 1 and not readonly
        plan = planned(settings, bits=bits, segments=segments) if segmented and bits is not None else None
        radius = None if readonly else (bits if settings.radius is None else settings.radius)
        return cls(
            settings.path if path is None else path,
            bits,
            radius,
            plan=plan,
            expected_entries=settings.expected_entries,
            max_age=settings.max_age_seconds,
            max_entries=settings.max_entries,
            payload_bytes=payload_bytes,
            max_tables=settings.max_tables,
            time_bucket=settings.time_bucket_seconds,
            map_size=settings.map_size_bytes,
            max_map_size=settings.max_map_size_bytes,
            sync=settings.sync,
            readonly=readonly,
            mirror_bytes=settings.mirror_bytes,
            signing=signing,
            key_capacity=key_capacity,
            payload_kind=payload_kind,
        )

    # ----------------------------------------------------------------- opening

    def _open_parts(self) -> None:
        """The parts over the environment as it is open now, with nothing cached yet."""
        self._store = store = Store(self.env, self.fmt, readonly=self.readonly)
        if store.missing():
            raise PlanError(f"{self.path}: index databases missing; is it a streamdedup index?")
        ids, contents = id_index(store), content_index(store)
        if self.fmt.chunked_runs:
            self._unchunk(store, ids, contents)
        self._cached = cached = Cached(store, self.path, readonly=self.readonly, mirror_bytes=self._mirror_bytes)
        self._lookup = lookup = Lookup(store, cached, ids, contents, self.key_capacity)
        staging = Staging(store, cached)
        self._undo = undo = UndoRecords(store)
        self._expiry = expiry = Expiry(store, cached, lookup, staging, undo)
        self._writes = Writes(
            store,
            cached,
            self._lookup,
            staging,
            expiry,
            undo,
            max_age=self.max_age,
            max_entries=self.max_entries,
            key_capacity=self.key_capacity,
        )

    def _unchunk(self, store: Store, ids: Ids, contents: Contents | NoContents) -> None:
        """Rewrite the sorted runs of an index of an older format whole, and mark it as this format, in one
        transaction."""
        runs = [table for table in store.tables if isinstance(table, SortedRuns)]
        hashed = (ids.runs if isinstance(ids, HashedIds) else None, contents)
        runs += [part.runs for part in hashed if isinstance(part, HashedRuns)]
        with self.env.begin(write=True) as txn:
            for table in runs:
                table.unchunk(txn)
            mark_current(txn, store.meta)
        self.fmt = replace(self.fmt, chunked_runs=False)
        store.fmt = self.fmt

    # ----------------------------------------------------------------- transactions

    def _read(self) -> Any:
        return begin_read(self.env)

    def _write(self, work: Callable[[Any], _T]) -> _T:
        """Run ``work(txn)`` in one write transaction; on a full map grow it and redo the whole batch."""
        if self.readonly:
            raise PermissionError(f"index at {self.path} is open read-only")
        while True:
            try:
                with _collector_paused(), self._cached.transaction():
                    txn = self.env.begin(write=True)
                    try:
                        result = work(txn)
                        self._cached.seal(txn)
                    except BaseException:
                        txn.abort()
                        raise
                    try:
                        txn.commit()
                    except lmdb.MapFullError:
                        raise
                    except lmdb.Error as exc:
                        # The commit could not write its pages (disk full, I/O error): LMDB keeps the
                        # previous meta page, so every earlier batch stays intact.
                        raise IndexStorageError(f"batch not stored: {exc}") from exc
                    self._cached.publish()
                    return result
            except lmdb.MapFullError:
                size = self.env.info()["map_size"]
                if self._max_map_size is not None and size >= self._max_map_size:
                    raise IndexStorageError(
                        f"index map is full at max_map_size={self._max_map_size} bytes; batch not stored"
                    ) from None
                grown = size * 2 if self._max_map_size is None else min(size * 2, self._max_map_size)
                self.env.set_mapsize(grown)

    # ----------------------------------------------------------------- lookup

    def search(
        self,
        fps: np.ndarray,
        *,
        min_time: float | None = None,
        keys: TableKeys | None = None,
        max_candidates: int | None = None,
    ) -> SearchResult:
        """All stored entries within the radius of each query, as flat arrays (see SearchResult). ``keys``: the
        queries' table keys, when already computed (``table_keys(index.plan, fps)``). ``max_candidates``: on an
        entry-valued index, each query's that many entries found through the most tables (the newest among
        equals) and :meth:`~TableKeys.well_shared`, so a query sharing hot keys with thousands of entries still
        reads a bounded number of them."""
        fps = self._lookup.checked(fps)
        with self._read() as txn:
            return self._lookup.search(txn, fps, min_time, keys, max_candidates)[0]

    def candidates(
        self, fps: np.ndarray, *, keys: TableKeys | None = None, max_candidates: int | None = None
    ) -> Candidates:
        """The stored entries ``search`` finds, with the tables each shares with its query: a decision verifies
        them on :meth:`times_and_payloads`, and reads the records (:meth:`records_of`) of the few that pass."""
        fps = self._lookup.checked(fps)
        with self._read() as txn:
            return self._lookup.candidates(txn, fps, keys, max_candidates)

    def same_contents(self, fps: np.ndarray, payloads: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Entries that may hold exactly these fingerprints and payloads ((n, bytes) uint8), found by content:
        the row (ascending) and entry key of each, to be verified as candidates (some are removed, a few collide);
        None on an index without contents (created before format 9), whose exact copies only the tables find."""
        fps = self._lookup.checked(fps)
        with self._read() as txn:
            return self._lookup.contents.find(txn, fps, payloads)

    def times_and_payloads(self, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each of these entry keys (any order): whether it is still stored, its event time and its payload,
        on an entry-valued index through the writer's cache of them."""
        with self._read() as txn:
            return self._lookup.times_and_payloads(txn, np.asarray(entries, dtype=np.uint64))

    def records_of(self, entries: np.ndarray, *, payloads: bool = True) -> tuple[np.ndarray, EntryRecords]:
        """The records of these entry keys: the position in ``entries`` of each one still stored (ascending),
        and its record, row for row; with ``payloads=False`` the payloads are not read (an empty column)."""
        with self._read() as txn:
            return self._lookup.records_of(txn, np.asarray(entries, dtype=np.uint64), payloads=payloads)

    def entries_with_ids(self, ids: Sequence[str]) -> tuple[np.ndarray, EntryRecords]:
        """The stored entries of these ids: the position in ``ids`` of each one found (ascending), and its
        entry's record, row for row."""
        with self._read() as txn:
            at, seqs = self._lookup.entries_of_ids(txn, [x.encode() for x in ids])
            present, records = self._lookup.records_of(txn, seqs)
        return at[present], records

    def kept_after(self, entries: np.ndarray) -> np.ndarray:
        """How many kept documents were stored after each of these entries (entry keys, as ``candidates``
        gives them): an entry is visible to a document while fewer than ``max_entries`` kept documents came
        between them, and eviction removes it once that many are stored."""
        with self._read() as txn:
            return self._store.kept_after(txn, entries)

    def query(self, fps: np.ndarray, *, min_time: float | None = None) -> list[list[tuple[str, int]]]:
        """Per query, ``[(id, distance), ...]`` nearest first, ties in insertion order."""
        fps = self._lookup.checked(fps)
        with self._read() as txn:
            result, records = self._lookup.search(txn, fps, min_time)
            if records is None:
                records = self._lookup.records(txn, result.entries)
        return self._lookup.grouped(len(fps), result, records)

    # ----------------------------------------------------------------- writing

    def add(
        self,
        ids: Sequence[str],
        fps: np.ndarray,
        *,
        times: Sequence[float] | np.ndarray | None = None,
        payloads: Sequence[bytes] | np.ndarray | None = None,
        origins: Sequence[tuple[str, int, int] | None] | None = None,
        source_offsets: Mapping[tuple[str, int], int] | None = None,
        keys: TableKeys | None = None,
        parts: Sequence[tuple[int, Mapping[tuple[str, int], int]]] | None = None,
    ) -> None:
        """Store a batch (and the source offsets after it) in ONE write transaction; a re-added id replaces.
        ``keys``: the batch's table keys, when already computed (``table_keys(index.plan, fps)``). ``parts``:
        consecutive parts of the batch, as (end row, source offsets after it), in place of ``source_offsets``:
        each is stored as a batch of its own in the same transaction, so a rollback to the offsets between two
        parts undoes the later ones whole (one undo record each)."""
        batch = Batch.checked(self._lookup, ids, fps, times, payloads, origins, keys)
        batch_parts = [(len(batch), source_offsets)] if parts is None else parts
        self._write(lambda txn: self._writes.add(txn, batch, batch_parts))

    # ----------------------------------------------------------------- removal, expiry, rollback

    def remove(self, ids: Sequence[str]) -> int:
        """Remove entries by id (unknown ids are ignored); returns how many were removed."""
        id_bytes = [x.encode() for x in ids]

        def work(txn: Any) -> int:
            _, seqs = self._lookup.entries_of_ids(txn, id_bytes)
            removed = self._expiry.remove(txn, seqs, None)
            if removed:
                self._undo.forget(txn)
            return removed

        return self._write(work)

    def expire(self, now: float | None = None) -> int:
        """Remove entries with event time before ``now - max_age`` (``now``: the index's own clock, see
        CLOCK_WINDOW, by default); returns how many were removed."""
        max_age = self.max_age
        if max_age is None:
            return 0

        def work(txn: Any) -> int:
            clock = self._store.clock(txn) if now is None else now
            removed = self._expiry.expire(txn, clock - max_age, None) if clock > -math.inf else 0
            if removed:
                self._undo.forget(txn)
            return removed

        return self._write(work)

    def source_offsets(self) -> dict[tuple[str, int], int]:
        with self._read() as txn:
            return self._store.source_offsets(txn)

    def rollback(self, offsets: Mapping[tuple[str, int], int]) -> int:
        """Remove entries whose origin offset >= offsets[(topic, partition)] and reset those source offsets;
        returns how many were removed.

        The newest batches whose entries all come from those offsets on are undone whole, from their undo records
        (the last ``UNDO_BATCHES``): what they removed (expiry, eviction, a re-added id) comes back, and so do the
        clock and the expiry rows, so that a replay of their records meets the index the first run met. Entries
        of an older batch, or of one only partly rolled back, are removed alone; nothing is undone after that."""

        return self._write(lambda txn: self._expiry.rollback(txn, offsets))

    # ----------------------------------------------------------------- size, stats, maintenance

    def __len__(self) -> int:
        with self._read() as txn:
            return self._store.counter(txn, META_COUNT)

    def _disk_bytes(self) -> dict[str, int]:
        """Bytes in use per database, from LMDB's own page counts (not the sparse file size)."""
        out = {}
        with self._read() as txn:
            for name, db in self._store.named():
                stat = txn.stat(db)
                out[name] = (stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]) * stat["psize"]
        return out

    def usage(self) -> dict[str, int]:
        """What the index holds and occupies: entries, disk_bytes (LMDB pages in use), map_size, and this writer's
        copies in memory (mirrored_tables of the merged tables, and the records read lately: mirror_bytes in all).
        Cheap enough for a service to refresh every few seconds, unlike ``stats`` (its plan's recall table)."""
        with self._read() as txn:
            count = self._store.counter(txn, META_COUNT)
        mirror = self._cached.mirror
        mirrored = [rows for rows in mirror.tables if rows is not None] if mirror is not None else []
        records = 0 if mirror is None else len(mirror.records) * RecordCache.row_bytes(self.fmt.payload_bytes)
        return {
            "entries": count,
            "disk_bytes": sum(self._disk_bytes().values()),
            "map_size": self.env.info()["map_size"],
            "mirrored_tables": len(mirrored),
            "mirror_bytes": sum(rows.nbytes for rows in mirrored) + records,
        }

    def stats(self) -> dict[str, Any]:
        disk = self._disk_bytes()
        with self._read() as txn:
            count = self._store.counter(txn, META_COUNT)
            clock = self._store.clock(txn)
            sources = self._store.source_offsets(txn)
            with txn.cursor(self._store.times) as cursor:
                first_key = cursor.key() if cursor.first() else None
            staged_rows = sum(map(len, self._cached.staged(txn)))
            unswept = int(self._store.unswept(txn).max(initial=0)) if self.fmt.entry_valued else 0
            undoable = txn.stat(self._store.undo)["entries"] if self._store.undo is not None else 0
        table_bytes = sum(v for k, v in disk.items() if k.startswith(names.INDEX_DB_TABLE_PREFIX))
        return {
            "path": str(self.path),
            "entries": count,
            "plan": self.plan.describe(),
            "table_values": self.fmt.table_values,
            "table_layout": self.fmt.table_layout,
            "record_layout": self.fmt.record_layout,
            "id_layout": self.fmt.id_layout,
            "contents": self.fmt.contents,
            "payload_kind": self.fmt.payload_kind,
            "payload_bytes": self.payload_bytes,
            # How the stored fingerprints and payloads were made (None: not recorded, an older index).
            "signing": self.signing,
            "max_age": self.max_age,
            "max_entries": self.max_entries,
            # Expiry's clock: the median event time of the latest CLOCK_WINDOW entries (never moving back).
            "clock": None if clock == -math.inf else clock,
            "oldest_bucket_start": None if first_key is None else bucket_start(first_key, self.time_bucket),
            "map_size": self.env.info()["map_size"],
            "disk_bytes": sum(disk.values()),
            "table_bytes": table_bytes,
            "staged_rows": staged_rows,
            # Entries removed whose table rows some table still holds, until it is swept (an index of entries).
            "unswept_removals": unswept,
            # Batches that ``rollback`` can still undo whole (see UNDO_BATCHES).
            "undoable_batches": undoable,
            "table_bytes_per_entry": table_bytes / count if count else None,
            "other_bytes_per_entry": (sum(disk.values()) - table_bytes) / count if count else None,
            "disk_bytes_by_db": disk,
            "source_offsets": {f"{t}:{p}": o for (t, p), o in sorted(sources.items())},
        }

    def export(self) -> Iterable[dict[str, Any]]:
        """Every entry in insertion order, as JSON-ready dicts (fingerprint as hex, payload as hex)."""
        with self._read() as txn, txn.cursor(self._store.entries) as cursor:
            keys = cursor.iternext(keys=True, values=False)
            while chunk := list(islice(keys, 10_000)):
                records = self._lookup.records(txn, np.frombuffer(b"".join(chunk), dtype=U64).astype(np.uint64))
                for i, entry_id in enumerate(records.ids):
                    origin = records.origins[i]
                    yield {
                        "id": entry_id,
                        "fingerprint": "".join(f"{int(w):016x}" for w in records.fingerprints[i]),
                        "time": float(records.times[i]),
                        "origin": list(origin) if origin else None,
                        "payload": records.payloads[i].tobytes().hex(),
                    }

    def compact(self) -> tuple[int, int]:
        """Rewrite the environment without free pages (LMDB compacting copy); returns file sizes before/after."""
        before = (self.path / "data.mdb").stat().st_size
        target = self.path.with_name(self.path.name + ".compact")
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        self.env.copy(str(target), compact=True)
        self.env.close()
        os.replace(target / "data.mdb", self.path / "data.mdb")
        shutil.rmtree(target)
        self.env = lmdb.open(str(self.path), max_dbs=64, readahead=False, subdir=True)
        self._open_parts()
        return before, (self.path / "data.mdb").stat().st_size

    def close(self) -> None:
        """Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._cached.save_key_filter()
        if not self.sync and not self.readonly:
            # Without a sync per commit, one flush at the end leaves the file complete on disk.
            self.env.sync(True)
        self.env.close()

    def __enter__(self) -> SegmentIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic GC for a batch: it would rescan the millions of short-lived key/value objects
    a batch creates (none of them cyclic) and double the cost of building them."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
