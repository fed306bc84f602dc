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
  payload, id). ``ids``: id -> sequence. ``times``: (time bucket, first sequence of a batch) -> that batch's
  sequences in the bucket as (start, stop) runs: one row per batch, and expiry and eviction read only the
  oldest rows. ``origins``: (topic, partition, offset) -> sequence, for rollback. ``sources``: (topic,
  partition) -> next offset. ``topics``: topic name -> small id. ``meta``: plan, format, counters.
- ``undo``: per batch that stored entries, the last ``UNDO_BATCHES`` of them, what it changed beyond its own
  entries: the records it removed (expiry, ``max_entries`` eviction, a re-added id), the ``times`` rows it
  deleted or trimmed, and the clock, its window and the count before it. ``rollback`` undoes the newest
  batches whole with them, so a replay finds the index exactly as the first run did.
- ``key-filter.npz`` beside the environment: the last writer's key filter, saved when it closed (see
  ``key_filter``), for the next writer to load instead of rebuilding it.

Every batch is one write transaction: the entries, their table rows and the source offsets commit together
or not at all, so a crash at any moment leaves exactly the committed batches.
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import logging
import math
import os
import shutil
import threading
import time as wallclock
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from itertools import compress, islice, repeat
from operator import is_not, itemgetter
from pathlib import Path
from typing import Any, TypeVar

import lmdb
import numpy as np

from .. import names
from ..settings import IndexSettings
from .key_filter import KeyFilter
from .keys import TableKeys, most_shared, packed, run_ranks, table_keys, table_rows
from .mirror import MIRROR_RECORD_BYTES, TableMirror
from .packed_ids import PackedIds
from .plan import IndexPlan, PlanError, make_plan, make_segment_plan, scatter_bits
from .sorted_rows import SortedRows, expand_ranges
from .table import BIG_ENDIAN_U64 as _U64
from .table import DuplicateRows, PackedBuckets, TableLayout, rows_in, table_class

__all__ = ["STORAGE_ERRORS", "EntryRecords", "IndexStorageError", "SearchResult", "SegmentIndex", "planned"]

log = logging.getLogger(__name__)

FORMAT_VERSION = 5
# Format 1 had no staged rows; format 2 stored folds in every plan's tables; formats 1-3 kept every table as
# dupsort rows; format 4 had no undo records. All read as format 5 (with none staged, with fold values, with the
# rows layout, with nothing to undo) and are marked 5 when opened to write: older code must not misread new
# indexes, nor write batches that the undo records would then not account for.
_READABLE_FORMATS = (1, 2, 3, 4, 5)
NO_TOPIC = 0xFFFFFFFF
MAX_ID_KEY_BYTES = 480  # LMDB keys stop at 511 bytes; longer ids are keyed by their BLAKE2b digest.
_META_FORMAT = b"format"
_META_NEXT_SEQ = b"next_seq"
_META_COUNT = b"count"
_META_CLOCK = b"clock"
_META_CLOCK_WINDOW = b"clock_window"  # event times of the latest entries added, whose median moves the clock
CLOCK_WINDOW = 1001
"""Entries whose median event time is the clock expiry runs by: a few entries stamped far ahead (a producer's
clock years off) move it nowhere, where the newest time would expire everything stored before them."""
UNDO_BATCHES = 8
"""Batches that stored entries whose changes ``rollback`` can undo exactly: the service has at most two
uncommitted in Kafka, and a batch that fails in part is stored in several."""
_META_NEXT_TOPIC = b"next_topic"
_META_STAGED_GENERATION = b"staged_generation"
_META_NEXT_MERGE = b"next_merge"
_META_UNSWEPT = b"unswept"  # per table: entries removed since the table was last swept (entry-valued tables)
_META_KEYED_WRITES = b"keyed_writes"  # batches that added table rows: what a key filter is valid for
_META_KEY_FILTER_TOKEN = b"key_filter_token"  # names the saved key filter; deleted by every batch that adds keys
KEY_FILTER_FILE = "key-filter.npz"
_FILTER_BUILD_ROWS = 65_536
_ORIGIN = np.dtype([("topic", "<u4"), ("partition", "<i4"), ("offset", "<i8")])
_T = TypeVar("_T")
_FOLD_VALUES, _ENTRY_VALUES = "folds", "entries"


class IndexStorageError(RuntimeError):
    """A batch could not be stored (disk full, map at its limit); nothing committed before it is lost."""


STORAGE_ERRORS: tuple[type[Exception], ...] = (IndexStorageError, lmdb.Error)
"""Errors of the index's storage, whatever the batch holds: no document of it is to blame."""


@dataclass(frozen=True)
class SearchResult:
    """Flat matches, sorted by (row, distance, insertion order): query row, entry key, Hamming distance."""

    rows: np.ndarray
    entries: np.ndarray
    distances: np.ndarray

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
            for t, p, o in zip(rows["topic"].tolist(), rows["partition"].tolist(), rows["offset"].tolist())
        ]


    def origin(self, row: int) -> tuple[str, int, int] | None:
        """One entry's (topic, partition, offset), None when stored without one."""
        topic, partition, offset = self.origin_rows[row].tolist()
        return None if topic == NO_TOPIC else (self.topic_names[topic], partition, offset)


def _entries_in_tables(plan: IndexPlan) -> bool:
    """Whether a new index under ``plan`` stores entry keys in its tables. A fold is kept as the value only where
    it can reject candidates before their records are read: on 64-bit fingerprints, or under a radius."""
    return plan.bits > 64 and plan.radius >= plan.bits


def _seq_bytes(seqs: np.ndarray) -> list[bytes]:
    return np.ascontiguousarray(seqs, dtype=_U64).view("V8").tolist()


class _TransactionState(threading.local):
    """The calling thread's write transaction, as the staged rows and the key filter see it."""

    def __init__(self) -> None:
        self.writing = False
        self.changed = False
        self.staged: list[SortedRows] | None = None
        # (filter, keyed-writes count before) for each batch whose keys went into that filter in this transaction.
        self.filtered: list[tuple[KeyFilter, int]] = []
        # The merged tables' copy in memory as this transaction changes them, published when it commits.
        self.mirror: TableMirror | None = None
        # What the batch being stored changes beyond its own entries, for ``rollback`` to undo (None: not recorded).
        self.undo: _Undo | None = None


@dataclass
class _Undo:
    """One batch's changes beyond its own entries (``first_seq`` on): the state before it of the clock, its window
    and the count; the records it removed; the ``times`` rows it deleted or trimmed (None: a row it added); and
    on a fold-valued index, the table rows it deleted (table, key, value)."""

    first_seq: int
    count: int
    clock: bytes | None
    window: bytes | None
    removed_seqs: list[np.ndarray]
    removed_heads: list[np.ndarray]
    removed_ids: list[bytes]
    times: dict[bytes, bytes | None]
    table_rows: list[tuple[int, np.ndarray, np.ndarray]]

    def pack(self) -> bytes:
        seqs = np.concatenate(self.removed_seqs) if self.removed_seqs else np.zeros(0, np.uint64)
        heads = np.concatenate(self.removed_heads) if self.removed_heads else np.zeros(0, np.uint8)
        keys, values = list(self.times), list(self.times.values())
        rows = self.table_rows
        arrays = {
            "header": np.array([self.first_seq, self.count], dtype=np.uint64),
            "clock": np.frombuffer(self.clock or b"", dtype=np.uint8),
            "has_clock": np.array([self.clock is not None, self.window is not None]),
            "window": np.frombuffer(self.window or b"", dtype=np.uint8),
            "seqs": seqs.astype(np.uint64),
            "heads": heads.view(np.uint8).ravel(),
            "id_lengths": np.array(list(map(len, self.removed_ids)), dtype=np.int64),
            "ids": np.frombuffer(b"".join(self.removed_ids), dtype=np.uint8),
            "time_keys": np.frombuffer(b"".join(keys), dtype=np.uint8),
            "time_present": np.array([v is not None for v in values], dtype=bool),
            "time_lengths": np.array([len(v or b"") for v in values], dtype=np.int64),
            "time_values": np.frombuffer(b"".join(v or b"" for v in values), dtype=np.uint8),
            "row_tables": np.concatenate([np.full(len(k), t, np.int64) for t, k, _ in rows]) if rows else np.zeros(0, np.int64),
            "row_keys": np.concatenate([k for _, k, _ in rows]).astype(np.uint64) if rows else np.zeros(0, np.uint64),
            "row_values": np.concatenate([v for _, _, v in rows]).astype(np.uint64) if rows else np.zeros(0, np.uint64),
        }
        out = io.BytesIO()
        np.savez(out, **arrays)
        return out.getvalue()


@dataclass(frozen=True)
class _UndoRecord:
    """A stored :class:`_Undo`, as ``rollback`` reads it."""

    first_seq: int
    count: int
    clock: bytes | None
    window: bytes | None
    seqs: np.ndarray
    heads: np.ndarray
    ids: list[bytes]
    times: list[tuple[bytes, bytes | None]]
    rows: tuple[np.ndarray, np.ndarray, np.ndarray]

    @classmethod
    def unpack(cls, raw: bytes, record: np.dtype) -> _UndoRecord:
        with np.load(io.BytesIO(raw), allow_pickle=False) as arrays:
            a = {name: arrays[name] for name in arrays.files}
        first_seq, count = a["header"].tolist()
        has_clock, has_window = a["has_clock"].tolist()
        ids_buffer, id_stops = a["ids"].tobytes(), np.cumsum(a["id_lengths"]).tolist()
        ids = [ids_buffer[low:high] for low, high in zip([0, *id_stops[:-1]], id_stops)]
        key_buffer, values_buffer = a["time_keys"].tobytes(), a["time_values"].tobytes()
        value_stops = np.cumsum(a["time_lengths"]).tolist()
        times = [
            (key_buffer[16 * i : 16 * i + 16], values_buffer[low:high] if present else None)
            for i, (present, low, high) in enumerate(zip(a["time_present"].tolist(), [0, *value_stops[:-1]], value_stops))
        ]
        return cls(
            first_seq,
            count,
            a["clock"].tobytes() if has_clock else None,
            a["window"].tobytes() if has_window else None,
            a["seqs"].astype(np.uint64),
            np.frombuffer(a["heads"].tobytes(), dtype=record),
            ids,
            times,
            (a["row_tables"], a["row_keys"].astype(np.uint64), a["row_values"].astype(np.uint64)),
        )


def _staged_key(table: int, first_seq: int) -> bytes:
    """(table, first entry of the batch) big-endian: a table's staged blobs are one key range."""
    return table.to_bytes(2, "big") + int(first_seq).to_bytes(8, "big")


def _orderable_time(times: np.ndarray) -> np.ndarray:
    """float64 -> uint64 whose unsigned order is the float order (negative times included)."""
    raw = np.ascontiguousarray(times, dtype=np.float64).view(np.uint64)
    negative = (raw >> np.uint64(63)).astype(bool)
    return np.where(negative, ~raw, raw | np.uint64(1 << 63))


def _group_expand(unique_keys: np.ndarray, inverse: np.ndarray, found_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Join queries to found rows sharing their key, without Python loops.

    ``unique_keys`` are the sorted distinct query keys, ``inverse`` maps each query to its key, and
    ``found_keys`` are the keys of the rows getmulti returned: grouped by key, in ``unique_keys`` order.
    Returns (query index, found row index) for every query x row pair with the same key.
    """
    if not len(found_keys):
        return np.zeros(0, np.intp), np.zeros(0, np.intp)
    group_starts = np.flatnonzero(np.concatenate([[True], found_keys[1:] != found_keys[:-1]]))
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
    ) -> None:
        self.path = Path(path)
        self.key_capacity = key_capacity
        self.sync = sync
        self._closed = False
        self.max_age = max_age
        self.max_entries = max_entries
        self.readonly = readonly
        self._max_map_size = max_map_size
        # Staged rows per table as of a generation; the write transaction in progress works on a copy,
        # published here once it commits. Per thread, like LMDB's transactions.
        self._staged_cache: tuple[int, list[SortedRows]] | None = None
        self._txn = _TransactionState()
        self._key_filter: KeyFilter | None = None
        self._key_filter_pointless = False  # the index outgrew what a filter can serve: none is kept
        self._mirror_bytes = mirror_bytes
        self._mirror: TableMirror | None = None
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
            self._open(bits, radius, expected_entries, payload_bytes, plan, max_tables, time_bucket, signing)
        except BaseException:
            self.env.close()
            raise

    @classmethod
    def from_settings(
        cls, settings: IndexSettings, *, bits: int | None, payload_bytes: int | None, path: str | os.PathLike[str] | None = None,
        readonly: bool = False, segments: int = 1, signing: str | None = None, key_capacity: int | None = None,
    ) -> SegmentIndex:
        """The index an ``index:`` config section describes (at ``settings.path`` unless ``path`` is given);
        ``segments`` > 1 (a segmented fingerprint) takes one table per segment. ``signing`` names how fingerprints
        and payloads are made (recorded in a new index; an existing one that recorded another refuses)."""
        # Classic plans are left to the constructor, which keeps an existing index's planning size.
        segmented = segments > 1 and not readonly and bits is not None
        plan = planned(settings, bits=bits, segments=segments) if segmented else None
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
        )

    # ----------------------------------------------------------------- opening

    def _open(
        self,
        bits: int | None,
        radius: int | None,
        expected_entries: int,
        payload_bytes: int | None,
        plan: IndexPlan | None,
        max_tables: int,
        time_bucket: float,
        signing: str | None,
    ) -> None:
        self._meta = self._db(names.INDEX_DB_META)
        with self._read() as txn:
            stored = txn.get(_META_FORMAT, db=self._meta) if self._meta is not None else None
        if stored is None:
            if self.readonly:
                raise PlanError(f"{self.path} holds no segment index")
            if bits is None or radius is None:
                raise PlanError("bits and radius are required to create an index")
            if plan is None:
                plan = make_plan(bits, radius, expected_entries, max_tables=max_tables)
            entry_valued = _entries_in_tables(plan)
            fmt = {
                "version": FORMAT_VERSION,
                "plan": json.loads(plan.to_json()),
                "payload_bytes": int(payload_bytes or 0),
                "time_bucket": float(time_bucket),
                "table_values": _ENTRY_VALUES if entry_valued else _FOLD_VALUES,
                # Entry-valued keys hold about one row each, which dupsort stores as a plain node.
                "table_layout": "rows" if entry_valued else "buckets",
                "signing": signing,
            }
            with self.env.begin(write=True) as txn:
                txn.put(_META_FORMAT, json.dumps(fmt, sort_keys=True).encode(), db=self._meta)
        else:
            fmt = json.loads(stored)
            if fmt["version"] not in _READABLE_FORMATS:
                raise PlanError(f"{self.path}: index format {fmt['version']}, this code reads {_READABLE_FORMATS}")
            if fmt["version"] != FORMAT_VERSION and not self.readonly:
                # Older code must not write to it (format 1 code misses staged rows): mark it as this format.
                fmt["version"] = FORMAT_VERSION
                with self.env.begin(write=True) as txn:
                    txn.put(_META_FORMAT, json.dumps(fmt, sort_keys=True).encode(), db=self._meta)
        self.plan = IndexPlan.from_json(json.dumps(fmt["plan"]))
        self.payload_bytes = int(fmt["payload_bytes"])
        self.time_bucket = float(fmt["time_bucket"])
        self.signing: str | None = fmt.get("signing")
        self._check_compatible(bits, radius, payload_bytes, plan, signing)
        self.bits = self.plan.bits
        self.radius = self.plan.radius
        self.words = self.bits // 64
        self._entry_valued = fmt.get("table_values", _FOLD_VALUES) == _ENTRY_VALUES
        self._table_layout: TableLayout = fmt.get("table_layout", "rows")
        self._prepare_layout()
        self._open_dbs()

    def _check_compatible(
        self, bits: int | None, radius: int | None, payload_bytes: int | None, plan: IndexPlan | None, signing: str | None
    ) -> None:
        stored = self.plan
        problems = []
        if signing is not None and signing != self.signing:
            # Fingerprints made another way rarely come within the radius of the stored ones: lookups would miss
            # their copies, silently.
            problems.append(f"signing {signing} (stored: {self.signing or 'none recorded, an older index'})")
        if bits is not None and bits != stored.bits:
            problems.append(f"bits {bits} (stored {stored.bits})")
        if radius is not None and radius != stored.radius:
            problems.append(f"radius {radius} (stored {stored.radius})")
        if payload_bytes is not None and payload_bytes != self.payload_bytes:
            problems.append(f"payload_bytes {payload_bytes} (stored {self.payload_bytes})")
        if plan is not None and not plan.same_lookup(stored):
            problems.append("a different table plan")
        if not problems:
            return
        if signing is not None and signing != self.signing:
            advice = (
                "its fingerprints and sketches were made another way (older code or other settings) and cannot be "
                "compared with new ones; move it aside or point index.path at a new folder, which fills as documents "
                "arrive (the entries it held would have expired within index.max_age_seconds)"
            )
        else:
            advice = "open it with the stored settings, or export/import it into a new index"
        raise PlanError(f"index at {self.path} is incompatible with the requested {', '.join(problems)}; {advice}")

    def _db(self, name: str, **flags: Any) -> Any:
        try:
            return self.env.open_db(name.encode(), create=not self.readonly, **flags)
        except lmdb.NotFoundError:
            return None

    def _open_dbs(self) -> None:
        layout = table_class(self._table_layout)
        self._tables: list[DuplicateRows | PackedBuckets] = [
            layout(self._db(f"{names.INDEX_DB_TABLE_PREFIX}{t}", **layout.flags), len(key), key_bytes, value_bytes)
            for t, (key, key_bytes, value_bytes) in enumerate(
                zip(self._key_positions, self._key_bytes, self._value_bytes, strict=True)
            )
        ]
        self._staged_db = self._db(names.INDEX_DB_STAGED)
        self._folds = self._db(names.INDEX_DB_FOLDS, **DuplicateRows.flags)
        self._times = self._db(names.INDEX_DB_TIMES)
        self._entries = self._db(names.INDEX_DB_ENTRIES)
        self._ids = self._db(names.INDEX_DB_IDS)
        self._origins = self._db(names.INDEX_DB_ORIGINS)
        self._sources = self._db(names.INDEX_DB_SOURCES)
        self._topics = self._db(names.INDEX_DB_TOPICS)
        self._undo = self._db(names.INDEX_DB_UNDO)
        missing = [db for db in (*(table.db for table in self._tables), self._folds, self._entries) if db is None]
        if missing:
            raise PlanError(f"{self.path}: index databases missing; is it a streamdedup index?")

    def _prepare_layout(self) -> None:
        plan = self.plan
        self._key_positions = [np.array(key, dtype=np.intp) for key in plan.tables]
        self._value_positions = [np.array(plan.value_bits(t), dtype=np.intp) for t in range(len(plan.tables))]
        self._key_bytes = [math.ceil(len(k) / 8) for k in self._key_positions]
        self._value_bytes = [math.ceil(len(v) / 8) for v in self._value_positions]
        self._record = np.dtype(
            [
                ("fp", "<u8", (self.words,)),
                ("time", "<f8"),
                ("topic", "<u4"),
                ("partition", "<i4"),
                ("offset", "<i8"),
                ("payload", "u1", (self.payload_bytes,)),
            ]
        )

    # ----------------------------------------------------------------- transactions

    def _read(self) -> Any:
        try:
            return self.env.begin(write=False, buffers=False)
        except lmdb.MapResizedError:
            # The writer grew the map since we opened: adopt its size and retry.
            self.env.set_mapsize(0)
            return self.env.begin(write=False, buffers=False)

    def _write(self, work: Callable[[Any], _T]) -> _T:
        """Run ``work(txn)`` in one write transaction; on a full map grow it and redo the whole batch."""
        if self.readonly:
            raise PermissionError(f"index at {self.path} is open read-only")
        while True:
            try:
                with _collector_paused(), self._staging_transaction():
                    txn = self.env.begin(write=True)
                    try:
                        result = work(txn)
                        generation = self._bump_staged_generation(txn)
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
                    if generation is not None and self._txn.staged is not None:
                        self._staged_cache = (generation, self._txn.staged)
                    for key_filter, keyed_before in self._txn.filtered:
                        if key_filter.covers == keyed_before:
                            key_filter.covers = keyed_before + 1
                    if self._txn.mirror is not None:
                        self._mirror = self._txn.mirror
                    return result
            except lmdb.MapFullError:
                size = self.env.info()["map_size"]
                if self._max_map_size is not None and size >= self._max_map_size:
                    raise IndexStorageError(
                        f"index map is full at max_map_size={self._max_map_size} bytes; batch not stored"
                    ) from None
                grown = size * 2 if self._max_map_size is None else min(size * 2, self._max_map_size)
                self.env.set_mapsize(grown)

    # ----------------------------------------------------------------- staged table rows

    @contextmanager
    def _staging_transaction(self) -> Iterator[None]:
        state = self._txn
        state.writing, state.staged, state.changed, state.filtered, state.mirror = True, None, False, [], None
        state.undo = None
        try:
            yield
        finally:
            state.writing, state.staged, state.changed, state.filtered, state.mirror = False, None, False, [], None
            state.undo = None

    def _bump_staged_generation(self, txn: Any) -> int | None:
        """A new generation number when this transaction changed the staged rows (so that other processes
        reload them), else None."""
        if not self._txn.changed:
            return None
        generation = self._counter(txn, _META_STAGED_GENERATION) + 1
        txn.put(_META_STAGED_GENERATION, generation.to_bytes(8, "big"), db=self._meta)
        return generation

    def _staged(self, txn: Any) -> list[SortedRows]:
        """Per table, the staged rows as ``txn`` sees them."""
        state = self._txn
        if state.staged is not None:
            return state.staged
        generation = self._counter(txn, _META_STAGED_GENERATION)
        cached = self._staged_cache
        if cached is None or cached[0] != generation:
            cached = self._staged_cache = (generation, self._load_staged(txn))
        if not state.writing:
            return cached[1]
        state.staged = list(cached[1])
        return state.staged

    def _load_staged(self, txn: Any) -> list[SortedRows]:
        blobs: list[list[bytes]] = [[] for _ in self._tables]
        if self._staged_db is not None:
            with txn.cursor(self._staged_db) as cursor:
                for key, blob in cursor:
                    blobs[int.from_bytes(key[:2], "big")].append(blob)
        staged = []
        for table, parts in enumerate(blobs):
            keys, values = self._tables[table].split_rows(b"".join(parts))
            order = np.argsort(keys, kind="stable")
            staged.append(SortedRows(keys[order], values[order], self._tables[table].key_bits))
        return staged

    def _stage(self, txn: Any, table: int, first_seq: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Stage a batch's rows of one table (keys ascending)."""
        if not len(keys):
            return
        staged = self._staged(txn)  # before the put: a reload from the database must not see this batch
        txn.put(_staged_key(table, first_seq), self._tables[table].join_rows(keys, values), db=self._staged_db)
        staged[table] = staged[table].merged(keys, values)
        self._txn.changed = True

    def _merge_staged(self, txn: Any, table: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Put a table's staged rows and a batch's rows of it into the table, in key order."""
        staged = self._staged(txn)
        old_keys, old_values = staged[table].keys, staged[table].values
        keys, values = np.concatenate([old_keys, keys]), np.concatenate([old_values, values])
        if self._entry_valued and self._sweep_due(txn, table):
            self._sweep(txn, table, keys, values)
        else:
            order = np.argsort(keys, kind="stable")
            self._tables[table].insert(txn, keys[order], values[order])
            self._mirror_inserted(txn, table, keys[order], values[order])
        if len(old_keys):
            self._unstage(txn, table)
            staged[table] = staged[table].emptied()
            self._txn.changed = True

    def _unstage(self, txn: Any, table: int) -> None:
        """Delete every staged blob of a table (its rows' keys share the table's prefix)."""
        prefix = table.to_bytes(2, "big")
        with txn.cursor(self._staged_db) as cursor:
            present = cursor.set_range(prefix)
            while present and cursor.key()[:2] == prefix:
                present = cursor.delete()

    def _drop_staged(self, txn: Any, table: int, doomed_keys: np.ndarray, doomed_values: np.ndarray) -> None:
        """Remove the staged rows of a table equal to any of the doomed (key, value) rows."""
        staged = self._staged(txn)
        kept = ~rows_in(staged[table].keys, staged[table].values, doomed_keys, doomed_values)
        if kept.all():
            return
        staged[table] = staged[table].kept(kept)
        self._txn.changed = True
        # The table's blobs are rewritten as one: removals are rare next to batches staged.
        self._unstage(txn, table)
        if kept.any():
            rows = staged[table]
            txn.put(_staged_key(table, 0), self._tables[table].join_rows(rows.keys, rows.values), db=self._staged_db)

    # ----------------------------------------------------------------- merged tables in memory

    def _table_mirror(self, txn: Any) -> TableMirror | None:
        """The merged tables' copy in memory as ``txn`` sees them (``mirror.py``), or None: only an entry-valued
        index's writer keeps one. A write transaction starts from the copy made at its keyed-batch count, or from
        an empty one, and merges fill it in table by table."""
        if not self._entry_valued or self.readonly or not self._mirror_bytes:
            return None
        state = self._txn
        if state.writing and state.mirror is not None:
            return state.mirror
        keyed = self._counter(txn, _META_KEYED_WRITES)
        current = self._mirror
        if current is None or current.covers != keyed:
            if not state.writing:
                return None
            current = TableMirror.empty(keyed, len(self._tables), self._mirror_bytes)
        if state.writing:
            state.mirror = current
        return current

    def _mirror_inserted(self, txn: Any, table: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Bring a table's copy in memory up to rows just merged into it (keys ascending; every value above the
        stored ones, as entry keys only grow); with no copy yet, make one from the whole table if it fits."""
        mirror = self._table_mirror(txn)
        if mirror is None:
            return
        current = mirror.tables[table]
        if current is not None:
            rows = current.merged(keys, values)
        elif mirror.fits(txn.stat(self._tables[table].db)["entries"]):
            rows = SortedRows(*self._tables[table].rows(txn), self._tables[table].key_bits)
        else:
            return
        self._txn.mirror = mirror.with_table(table, rows)

    # ----------------------------------------------------------------- encoding

    def _check_fps(self, fps: np.ndarray) -> np.ndarray:
        fps = np.asarray(fps)
        if fps.ndim == 1 and self.words == 1:
            fps = fps.reshape(-1, 1)
        if fps.ndim != 2 or fps.shape[1] != self.words:
            raise ValueError(f"fingerprints must have shape (n, {self.words}) for {self.bits}-bit index, got {fps.shape}")
        if fps.dtype != np.uint64:
            raise ValueError(f"fingerprints must be uint64, got {fps.dtype}")
        return np.ascontiguousarray(fps)

    def _keys(self, fps: np.ndarray, keys: TableKeys | None) -> TableKeys:
        """``keys`` when given (computed elsewhere for these ``fps``, e.g. by a signing worker), checked
        against the stored plan; else computed here."""
        if keys is None:
            return table_keys(self.plan, fps)
        if not keys.plan.same_lookup(self.plan):
            raise ValueError("table keys of another plan than this index's")
        if len(keys) != len(fps):
            raise ValueError(f"table keys for {len(keys)} rows do not fit {len(fps)} fingerprints")
        return keys

    def _folds_from_found(self, table_of: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``_folds_from_rows`` of rows from several tables (``table_of`` each)."""
        if self.words > 1:
            return values
        folds = np.empty(len(values), dtype=np.uint64)
        order = np.argsort(table_of, kind="stable")
        bounds = np.searchsorted(table_of[order], np.arange(len(self._tables) + 1)).tolist()
        for table in range(len(self._tables)):
            rows = order[bounds[table] : bounds[table + 1]]
            if len(rows):
                folds[rows] = self._folds_from_rows(table, keys[rows], values[rows])
        return folds

    def _folds_from_rows(self, table: int, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Rebuild the 64-bit folds of table rows (the inverse of the key/value split)."""
        if self.words > 1:
            return values
        return scatter_bits(keys, self.plan.tables[table]) | scatter_bits(values, self.plan.value_bits(table))

    @staticmethod
    def _id_keys(id_bytes: list[bytes]) -> list[bytes]:
        if max(map(len, id_bytes), default=0) <= MAX_ID_KEY_BYTES:
            return id_bytes
        return [b if len(b) <= MAX_ID_KEY_BYTES else b"\xff#" + hashlib.blake2b(b, digest_size=32).digest() for b in id_bytes]

    # ----------------------------------------------------------------- lookup

    def _search(
        self,
        txn: Any,
        fps: np.ndarray,
        min_time: float | None,
        keys: TableKeys | None = None,
        max_candidates: int | None = None,
    ) -> tuple[SearchResult, EntryRecords | None]:
        n = len(fps)
        empty = SearchResult(np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64))
        if n == 0:
            return empty, None
        radius = self.radius
        batch_keys = self._keys(fps, keys)
        tables = len(self._tables)
        probes = batch_keys.runs & (batch_keys.keys != 0) if batch_keys.unkeyed_zero else batch_keys.runs
        # Every table's probes as flat (table, position) indices, table after table: the work around the reads
        # runs once over all tables, where a loop per table pays numpy's call overhead 32 times.
        flat = np.flatnonzero(probes.ravel())
        key_filter = self._trusted_key_filter(txn)
        if key_filter is not None and len(flat):
            flat = flat[key_filter.may_contain(flat // n, batch_keys.keys.ravel()[flat])]
        probed = batch_keys.keys.ravel()[flat]
        table_bounds = np.searchsorted(flat, np.arange(tables + 1) * n).tolist()
        staged = self._staged(txn)
        mirror = self._table_mirror(txn)
        found_probes, found_values = [], []
        for table, stored_table in enumerate(self._tables):
            low, high = table_bounds[table], table_bounds[table + 1]
            if low == high:
                continue
            table_probed = probed[low:high]
            mirrored = mirror.tables[table] if mirror is not None else None
            owners, stored = mirrored.read(table_probed) if mirrored is not None else stored_table.read(txn, table_probed)
            if len(owners):
                found_probes.append(low + owners)
                found_values.append(stored)
            if len(staged[table]):
                staged_probe, staged_values = staged[table].read(table_probed)
                if len(staged_probe):
                    found_probes.append(low + staged_probe)
                    found_values.append(staged_values)
        # Nothing found (probes can pass the key filter on a removed row's bit, or miss the staged rows).
        if not found_probes:
            return empty, None
        probe_of, stored = np.concatenate(found_probes), np.concatenate(found_values)
        found_at = flat[probe_of]
        # Each stored row pairs with every batch row of its key's run (usually one): rows of a key that several
        # batch rows share pair again with each further one (more_at), through their row (source).
        run_ends = (batch_keys.run_ends() + np.arange(tables)[:, None] * n).ravel()
        shared = np.flatnonzero((run_ends[flat] - flat > 1)[probe_of])
        more_at, source = expand_ranges(found_at[shared] + 1, run_ends[found_at[shared]])
        source = shared[source]
        if self._entry_valued:
            # The rows name their entries, and no radius cuts: every candidate goes on to its record.
            near_at, named = np.concatenate([found_at, more_at]), np.concatenate([stored, stored[source]])
        else:
            # Candidates outside the radius go before anything else is built for them (or copied).
            values = batch_keys.values.ravel()
            near = np.flatnonzero(np.bitwise_count(stored ^ values[found_at]) <= radius)
            near_more = np.flatnonzero(np.bitwise_count(stored[source] ^ values[more_at]) <= radius)
            near_at = np.concatenate([found_at[near], more_at[near_more]])
            if not len(near_at):
                return empty, None
            rows = np.concatenate([near, source[near_more]])
            named = self._folds_from_found(near_at // n, probed[probe_of[rows]], stored[rows])
        qi = batch_keys.rows.ravel()[near_at]
        qi, named, shared = _distinct_pairs(qi, named)
        if max_candidates is not None and self._entry_valued:
            best = most_shared(qi, named, shared, max_candidates)
            best = best[batch_keys.well_shared(qi[best], shared[best])]
            qi, named = qi[best], named[best]
        if self._entry_valued:
            rows_q, seqs = qi, named
        else:
            unique_folds, inverse = np.unique(named, return_inverse=True)
            with txn.cursor(self._folds) as cursor:
                raw = cursor.getmulti(_seq_bytes(unique_folds), dupdata=True, dupfixed_bytes=8, keyfixed=True)
            rows = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 16)
            pair, ri = _group_expand(unique_folds, inverse, rows[:, :8].copy().view(_U64).ravel().astype(np.uint64))
            rows_q = qi[pair]
            seqs = rows[ri, 8:].copy().view(_U64).ravel().astype(np.uint64)
        records = None
        if self.words == 1:
            distances = np.bitwise_count(named[pair] ^ fps[rows_q, 0]).astype(np.int64)
        if self.words > 1 or min_time is not None:
            records = self._records(txn, np.unique(seqs))
            slot = np.searchsorted(records.entries, seqs)
            present = slot < len(records.entries)
            present[present] = records.entries[slot[present]] == seqs[present]
            rows_q, seqs, slot = rows_q[present], seqs[present], slot[present]
            if self.words == 1:
                distances = distances[present]
            else:
                distances = np.bitwise_count(records.fingerprints[slot] ^ fps[rows_q]).sum(axis=1).astype(np.int64)
            keep = distances <= radius
            if min_time is not None:
                keep &= records.times[slot] >= min_time
            rows_q, seqs, distances = rows_q[keep], seqs[keep], distances[keep]
        word = packed([rows_q, distances, seqs]) if len(rows_q) else None
        order = np.lexsort((seqs, distances, rows_q)) if word is None else np.argsort(word[0])
        return SearchResult(rows_q[order], seqs[order], distances[order]), records

    def _trusted_key_filter(self, txn: Any) -> KeyFilter | None:
        """The key filter, if it holds every key ``txn`` sees; rebuilt when it does not and ``txn`` is a read
        transaction (doubled when it holds them all but has outgrown its capacity). A writer's own lookups
        repeat, so only writers keep one."""
        if self.readonly or self._key_filter_pointless:
            return None
        keyed, entries = self._counter(txn, _META_KEYED_WRITES), self._counter(txn, _META_COUNT)
        current = self._key_filter
        if current is not None and not current.useful(entries):
            # Every key has a bit set by now (short keys, or more entries than the largest bitmaps serve).
            self._key_filter, self._key_filter_pointless = None, True
            return None
        if current is not None and current.covers == keyed:
            if self._txn.writing or not current.outgrown(entries):
                return current
            # Outgrown: doubled, it serves on without reading every stored entry again.
            while current is not None and current.outgrown(entries):
                current = current.doubled()
            if current is not None:
                self._key_filter = current
                return current
        if self._txn.writing:
            # A write transaction's view may hold changes it then aborts: a filter built from it could miss
            # rows that stay committed. Look up without one.
            return None
        token = txn.get(_META_KEY_FILTER_TOKEN, db=self._meta)
        saved = None if token is None else KeyFilter.load(self.path / KEY_FILTER_FILE, token, self.plan.key_bits, keyed)
        if saved is not None and saved.useful(entries) and not saved.outgrown(entries):
            self._key_filter = saved
            return saved
        self._key_filter = KeyFilter(self.plan.key_bits, 2 * entries, keyed)
        if not self._key_filter.useful(entries):
            self._key_filter, self._key_filter_pointless = None, True
            return None
        self._fill_key_filter(txn, self._key_filter)
        return self._key_filter

    def _save_key_filter(self) -> None:
        """Save a trusted key filter for the next writer to open this index, so it need not rebuild it."""
        key_filter = self._key_filter
        if self.readonly or key_filter is None:
            return
        token = os.urandom(16)
        try:
            key_filter.save(self.path / KEY_FILTER_FILE, token)
            with self.env.begin(write=True) as txn:
                # Only for the state it covers: a batch committed meanwhile by another writer leaves it unnamed.
                if self._counter(txn, _META_KEYED_WRITES) == key_filter.covers:
                    txn.put(_META_KEY_FILTER_TOKEN, token, db=self._meta)
        except (OSError, lmdb.Error) as exc:
            log.warning("key filter not saved (the next start rebuilds it): %s", exc)

    def _fill_key_filter(self, txn: Any, key_filter: KeyFilter) -> None:
        """Set the bits of every stored entry's keys."""
        size = self._record.itemsize
        with txn.cursor(self._entries) as cursor:
            records = cursor.iternext(keys=False, values=True)
            while chunk := list(islice(records, _FILTER_BUILD_ROWS)):
                head = np.frombuffer(b"".join(value[:size] for value in chunk), dtype=self._record)
                keys, _, _ = table_rows(self.plan, head["fp"].reshape(len(head), self.words).astype(np.uint64))
                key_filter.add(keys)

    def _fetch(self, txn: Any, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray, PackedIds]:
        """Raw records of the given entry keys, sorted by key (missing keys skipped): keys, heads, ids."""
        seqs = np.unique(np.asarray(seqs, dtype=np.uint64))
        # A write transaction's view may hold what it then aborts: only reads go through the cached records.
        mirror = None if self._txn.writing else self._table_mirror(txn)
        with txn.cursor(self._entries) as cursor:
            if mirror is None:
                found = cursor.getmulti(_seq_bytes(seqs))
                values = list(map(itemgetter(1), found))
            else:
                held = mirror.records.read(_seq_bytes(seqs), cursor.getmulti)
                present = np.fromiter(map(is_not, held, repeat(None)), dtype=bool, count=len(held))
                values = held if present.all() else list(compress(held, present))
        size = self._record.itemsize
        # Every key found (the usual case): the entries are the keys asked for.
        if len(values) == len(seqs):
            entries = seqs
        elif mirror is None:
            entries = np.frombuffer(b"".join(map(itemgetter(0), found)), dtype=_U64).astype(np.uint64)
        else:
            entries = seqs[present]
        # Heads and ids each joined in one pass of C (map with itemgetter), not sliced record by record; ids
        # stay bytes until read.
        head = np.frombuffer(b"".join(map(itemgetter(slice(None, size)), values)), dtype=self._record)
        id_lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values)) - size
        stops = np.cumsum(id_lengths)
        return entries, head, PackedIds(b"".join(map(itemgetter(slice(size, None)), values)), stops - id_lengths, stops)

    def _records(self, txn: Any, seqs: np.ndarray) -> EntryRecords:
        """Records of the given entry keys, sorted by key (missing keys skipped)."""
        entries, head, ids = self._fetch(txn, seqs)
        topics = self._topic_names(txn) if len(head) and (head["topic"] != NO_TOPIC).any() else {}
        origin_rows = np.empty(len(head), dtype=_ORIGIN)
        for name in ("topic", "partition", "offset"):
            origin_rows[name] = head[name]
        return EntryRecords(
            entries,
            ids,
            head["fp"].reshape(len(head), self.words).astype(np.uint64),
            head["time"].astype(np.float64),
            head["payload"].reshape(len(head), self.payload_bytes).copy(),
            origin_rows,
            topics,
        )

    def _topic_names(self, txn: Any) -> dict[int, str]:
        with txn.cursor(self._topics) as cursor:
            return {int.from_bytes(v, "big"): k.decode() for k, v in cursor}

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
        fps = self._check_fps(fps)
        with self._read() as txn:
            return self._search(txn, fps, min_time, keys, max_candidates)[0]

    def search_entries(
        self,
        fps: np.ndarray,
        *,
        min_time: float | None = None,
        keys: TableKeys | None = None,
        max_candidates: int | None = None,
    ) -> tuple[SearchResult, EntryRecords]:
        """``search`` plus the matched entries' records, row for row, from one read transaction (the lookup
        reads them anyway on wide fingerprints)."""
        fps = self._check_fps(fps)
        with self._read() as txn:
            result, records = self._search(txn, fps, min_time, keys, max_candidates)
            if records is None:
                records = self._records(txn, result.entries)
        return result, _reorder(records, np.searchsorted(records.entries, result.entries))

    def entries(self, keys: np.ndarray) -> EntryRecords:
        """Ids, fingerprints, times, payloads and origins of entry keys from ``search``, in bulk."""
        keys = np.asarray(keys, dtype=np.uint64)
        with self._read() as txn:
            records = self._records(txn, keys)
        slot = np.searchsorted(records.entries, keys)
        present = slot < len(records.entries)
        present[present] = records.entries[slot[present]] == keys[present]
        return _reorder(records, slot[present])

    def entries_with_ids(self, ids: Sequence[str]) -> tuple[np.ndarray, EntryRecords]:
        """The stored entries of these ids: the position in ``ids`` of each one found (ascending), and its
        entry's record, row for row."""
        id_keys = self._id_keys([x.encode() for x in ids])
        with self._read() as txn:
            with txn.cursor(self._ids) as cursor:
                found = cursor.getmulti(id_keys)
            seqs = np.frombuffer(b"".join(v for _, v in found), dtype=_U64).astype(np.uint64)
            records = self._records(txn, seqs)
        if not found:
            return np.zeros(0, np.intp), records
        # Found ids are rare (a replay, a redelivery): only then is each position looked up.
        seq_of = dict(found)
        at = [i for i, key in enumerate(id_keys) if key in seq_of]
        wanted = np.frombuffer(b"".join(seq_of[id_keys[i]] for i in at), dtype=_U64).astype(np.uint64)
        slot = np.searchsorted(records.entries, wanted)
        present = slot < len(records.entries)
        present[present] = records.entries[slot[present]] == wanted[present]
        return np.asarray(at, dtype=np.intp)[present], _reorder(records, slot[present])

    def query(self, fps: np.ndarray, *, min_time: float | None = None) -> list[list[tuple[str, int]]]:
        """Per query, ``[(id, distance), ...]`` nearest first, ties in insertion order."""
        fps = self._check_fps(fps)
        with self._read() as txn:
            result, records = self._search(txn, fps, min_time)
            if records is None:
                records = self._records(txn, result.entries)
        return self._group(len(fps), result, records)

    def _group(self, n: int, result: SearchResult, records: EntryRecords) -> list[list[tuple[str, int]]]:
        slot = np.searchsorted(records.entries, result.entries)
        out: list[list[tuple[str, int]]] = [[] for _ in range(n)]
        for row, s, distance in zip(result.rows.tolist(), slot.tolist(), result.distances.tolist()):
            out[row].append((records.ids[s], distance))
        return out

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
    ) -> None:
        """Store a batch (and the source offsets after it) in ONE write transaction; a re-added id replaces.
        ``keys``: the batch's table keys, when already computed (``table_keys(index.plan, fps)``)."""
        batch = self._batch(ids, fps, times, payloads, origins, keys)
        self._write(lambda txn: self._add_in(txn, batch, source_offsets))

    def _batch(self, ids, fps, times, payloads, origins, keys) -> dict[str, Any]:
        fps = self._check_fps(fps)
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
            raise ValueError(f"ids must be non-empty; rows {[i for i, b in enumerate(id_bytes) if not b][:10]} are empty")
        if times is None:
            times = np.full(n, wallclock.time())
        times = np.asarray(times, dtype=np.float64).reshape(-1)
        if len(times) != n or not np.isfinite(times).all():
            raise ValueError("times must be one finite event time per fingerprint")
        payload_rows = np.zeros((n, self.payload_bytes), dtype=np.uint8)
        if payloads is not None:
            if isinstance(payloads, np.ndarray):
                if payloads.shape != (n, self.payload_bytes):
                    raise ValueError(f"payloads must have shape ({n}, {self.payload_bytes}), got {payloads.shape}")
                payload_rows[:] = payloads
            else:
                payloads = list(payloads)
                too_long = [i for i, p in enumerate(payloads) if len(p) > self.payload_bytes]
                if len(payloads) != n or too_long:
                    raise ValueError(f"need {n} payloads of at most {self.payload_bytes} bytes (bad rows {too_long[:10]})")
                for i, p in enumerate(payloads):
                    payload_rows[i, : len(p)] = np.frombuffer(bytes(p), dtype=np.uint8)
        origins = list(origins) if origins is not None else [None] * n
        if len(origins) != n:
            raise ValueError(f"{len(origins)} origins for {n} fingerprints")
        return {
            "ids": ids,
            "id_bytes": id_bytes,
            "fps": fps,
            "times": times,
            "payloads": payload_rows,
            "origins": origins,
            "keys": self._keys(fps, keys),
        }

    def _counter(self, txn: Any, key: bytes) -> int:
        raw = txn.get(key, db=self._meta)
        return int.from_bytes(raw, "big") if raw else 0

    def _topic_ids(self, txn: Any, topics: Iterable[str]) -> dict[str, int]:
        out = {}
        for topic in set(topics):
            raw = txn.get(topic.encode(), db=self._topics)
            if raw is None:
                topic_id = self._counter(txn, _META_NEXT_TOPIC)
                txn.put(_META_NEXT_TOPIC, (topic_id + 1).to_bytes(8, "big"), db=self._meta)
                raw = topic_id.to_bytes(4, "big")
                txn.put(topic.encode(), raw, db=self._topics)
            out[topic] = int.from_bytes(raw, "big")
        return out

    def _add_in(self, txn: Any, batch: dict[str, Any], source_offsets: Mapping[tuple[str, int], int] | None) -> None:
        ids: list[str] = batch["ids"]
        n = len(ids)
        if n:
            if len(set(ids)) != n:
                # The last occurrence of an id in a batch wins, like a re-add in a later batch.
                last = {x: i for i, x in enumerate(ids)}
                batch = _subset(batch, np.array(sorted(last.values()), dtype=np.intp))
                ids = batch["ids"]
            id_bytes = batch["id_bytes"]
            id_keys = self._id_keys(id_bytes)
            self._txn.undo = _Undo(
                self._counter(txn, _META_NEXT_SEQ),
                self._counter(txn, _META_COUNT),
                txn.get(_META_CLOCK, db=self._meta),
                txn.get(_META_CLOCK_WINDOW, db=self._meta),
                [], [], [], {}, [],
            )
            with txn.cursor(self._ids) as cursor:
                existing = cursor.getmulti(id_keys)
            if existing:
                self._remove_in(txn, np.frombuffer(b"".join(v for _, v in existing), dtype=_U64).astype(np.uint64))
            self._insert_in(txn, batch, id_bytes, id_keys)
            window = np.concatenate([self._clock_window(txn), batch["times"]])[-CLOCK_WINDOW:]
            txn.put(_META_CLOCK_WINDOW, window.tobytes(), db=self._meta)
            clock = max(float(np.median(window)), self._clock(txn))
            txn.put(_META_CLOCK, np.float64(clock).tobytes(), db=self._meta)
            if self.max_age is not None:
                self._expire_in(txn, clock - self.max_age)
            if self.max_entries is not None:
                # Stale keys (entries already removed by id) make a round remove fewer than asked; go on.
                excess = self._counter(txn, _META_COUNT) - self.max_entries
                while excess > 0:
                    popped = self._pop_oldest(txn, excess, None)
                    if not len(popped):
                        break
                    excess -= self._remove_in(txn, popped)
            self._save_undo(txn)
        if source_offsets:
            self._put_sources(txn, source_offsets)

    def _insert_in(self, txn: Any, batch: dict[str, Any], id_bytes: list[bytes], id_keys: list[bytes]) -> None:
        fps, times, origins = batch["fps"], batch["times"], batch["origins"]
        n = len(fps)
        first_seq = self._counter(txn, _META_NEXT_SEQ)
        seqs = np.arange(first_seq, first_seq + n, dtype=np.uint64)
        seq_keys = _seq_bytes(seqs)
        head = np.zeros(n, dtype=self._record)
        head["fp"] = fps.reshape(n, self.words)
        head["time"] = times
        head["topic"] = NO_TOPIC
        head["payload"] = batch["payloads"].reshape(n, self.payload_bytes)
        # Counted in C first: batches all without origins (the offline mode) or all with (the service) are
        # the common cases, and neither takes a Python step per row here.
        missing = origins.count(None)
        if missing != n:
            rows, present, present_keys = np.arange(n), origins, seq_keys
            if missing:
                kept = [i for i, origin in enumerate(origins) if origin is not None]
                rows, present, present_keys = np.array(kept), [origins[i] for i in kept], [seq_keys[i] for i in kept]
            topics, partitions, offsets = zip(*present)
            topic_ids = self._topic_ids(txn, topics)
            head["topic"][rows] = topic_ids[topics[0]] if len(topic_ids) == 1 else [topic_ids[t] for t in topics]
            head["partition"][rows] = partitions
            head["offset"][rows] = offsets
            with txn.cursor(self._origins) as cursor:
                cursor.putmulti(zip(self._origin_keys(head[rows]), present_keys))
        heads = head.view(f"V{self._record.itemsize}").tolist()
        with txn.cursor(self._entries) as cursor:
            cursor.putmulti(zip(seq_keys, map(bytes.__add__, heads, id_bytes)), append=True)
        with txn.cursor(self._ids) as cursor:
            cursor.putmulti(zip(id_keys, seq_keys))
        batch_keys: TableKeys = batch["keys"]
        keyed = self._keys_added(txn, batch_keys.keys)
        if not self._entry_valued:
            folds = batch_keys.folds
            # Key order lets LMDB's cursor stay on the current leaf page between neighbouring puts.
            order = np.argsort(folds)
            with txn.cursor(self._folds) as cursor:
                cursor.putmulti(zip(_seq_bytes(folds[order]), _seq_bytes(seqs[order])))
        # Rows are staged; one table in turn takes its staged rows and this batch's (see the module docstring).
        merged = self._counter(txn, _META_NEXT_MERGE) % len(self._tables)
        for table in range(len(self._tables)):
            keys = batch_keys.keys[table]
            values = seqs[batch_keys.rows[table]] if self._entry_valued else batch_keys.values[table]
            if batch_keys.unkeyed_zero:
                wanted = keys != 0
                keys, values = keys[wanted], values[wanted]
            if self.key_capacity is not None:
                keys, values = self._within_capacity(txn, table, keys, values)
            if table == merged and self._tables[table].merge_due(txn, len(self._staged(txn)[table]) + len(keys)):
                self._merge_staged(txn, table, keys, values)
            else:
                self._stage(txn, table, first_seq, keys, values)
        txn.put(_META_NEXT_MERGE, (merged + 1).to_bytes(8, "big"), db=self._meta)
        if self._txn.mirror is not None:
            self._txn.mirror = self._txn.mirror.advanced(keyed + 1)
        # One row per (time bucket, batch): the batch's entry keys in that bucket as (start, stop) runs.
        buckets = self._buckets(times)
        order = np.argsort(buckets, kind="stable")
        edges = np.flatnonzero(np.diff(buckets[order])) + 1
        for bucket_rows in np.split(order, edges):
            members = seqs[bucket_rows]
            breaks = np.flatnonzero(np.diff(members) != 1) + 1
            starts = members[np.concatenate([[0], breaks])]
            stops = members[np.concatenate([breaks - 1, [len(members) - 1]])] + np.uint64(1)
            key = _seq_bytes(buckets[bucket_rows[:1]])[0] + seq_keys[bucket_rows[0]]
            if self._txn.undo is not None:
                self._txn.undo.times.setdefault(key, None)
            txn.put(key, np.stack([starts, stops], axis=1).astype(_U64).tobytes(), db=self._times)
        txn.put(_META_NEXT_SEQ, int(first_seq + n).to_bytes(8, "big"), db=self._meta)
        txn.put(_META_COUNT, (self._counter(txn, _META_COUNT) + n).to_bytes(8, "big"), db=self._meta)

    def _within_capacity(self, txn: Any, table: int, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows (``keys`` ascending, each key's rows in stream order) whose key still has room: the first of
        them up to ``key_capacity`` rows of that key, counting those stored or staged (a removed entry's row
        counts until its table's sweep). A hot key keeps its first documents and takes no more."""
        if not len(keys):
            return keys, values
        starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        held = self._rows_held(txn, table, keys[starts])
        room = run_ranks(starts, len(keys)) + np.repeat(held, np.diff(np.append(starts, len(keys)))) < self.key_capacity
        return keys[room], values[room]

    def _rows_held(self, txn: Any, table: int, unique_keys: np.ndarray) -> np.ndarray:
        """Rows each of these keys (ascending, distinct) holds in ``table``, merged and staged."""
        mirror = self._table_mirror(txn)
        mirrored = mirror.tables[table] if mirror is not None else None
        if mirrored is not None:
            low, high = mirrored.bounds(unique_keys)
            held = high - low
        else:
            owners, _ = self._tables[table].read(txn, unique_keys)
            held = np.bincount(owners, minlength=len(unique_keys))
        staged = self._staged(txn)[table]
        if len(staged):
            low, high = staged.bounds(unique_keys)
            held = held + (high - low)
        return held

    @staticmethod
    def _origin_keys(head: np.ndarray) -> list[bytes]:
        """(topic id, partition, offset) big-endian, so one partition's entries sort by offset."""
        keys = np.zeros(len(head), dtype=[("topic", ">u4"), ("partition", ">u4"), ("offset", ">u8")])
        keys["topic"], keys["partition"], keys["offset"] = head["topic"], head["partition"], head["offset"]
        return keys.view("V16").tolist()

    def _buckets(self, times: np.ndarray) -> np.ndarray:
        return _orderable_time(np.floor(times / self.time_bucket))

    def _clock(self, txn: Any) -> float:
        raw = txn.get(_META_CLOCK, db=self._meta)
        return float(np.frombuffer(raw, dtype=np.float64)[0]) if raw else -math.inf

    def _clock_window(self, txn: Any) -> np.ndarray:
        raw = txn.get(_META_CLOCK_WINDOW, db=self._meta)
        return np.frombuffer(raw, dtype=np.float64) if raw else np.zeros(0, dtype=np.float64)

    def _put_sources(self, txn: Any, source_offsets: Mapping[tuple[str, int], int]) -> None:
        topic_ids = self._topic_ids(txn, (topic for topic, _ in source_offsets))
        for (topic, partition), offset in source_offsets.items():
            key = topic_ids[topic].to_bytes(4, "big") + int(partition).to_bytes(4, "big")
            txn.put(key, int(offset).to_bytes(8, "big"), db=self._sources)

    # ----------------------------------------------------------------- removal and expiry

    def remove(self, ids: Sequence[str]) -> int:
        """Remove entries by id (unknown ids are ignored); returns how many were removed."""
        keys = self._id_keys([x.encode() for x in ids])

        def work(txn: Any) -> int:
            with txn.cursor(self._ids) as cursor:
                found = cursor.getmulti(keys)
            seqs = np.frombuffer(b"".join(v for _, v in found), dtype=_U64).astype(np.uint64)
            removed = self._remove_in(txn, seqs)
            if removed:
                self._forget_undo(txn)
            return removed

        return self._write(work)

    def expire(self, now: float | None = None) -> int:
        """Remove entries with event time before ``now - max_age`` (``now``: the index's own clock, see
        CLOCK_WINDOW, by default); returns how many were removed."""
        if self.max_age is None:
            return 0

        def work(txn: Any) -> int:
            clock = self._clock(txn) if now is None else now
            removed = self._expire_in(txn, clock - self.max_age) if clock > -math.inf else 0
            if removed:
                self._forget_undo(txn)
            return removed

        return self._write(work)

    def _expire_in(self, txn: Any, cutoff: float) -> int:
        # Whole buckets go; an entry at most one bucket younger than the cutoff waits for its bucket
        # (queries pass min_time to hide it meanwhile).
        return self._remove_in(txn, self._pop_oldest(txn, None, float(np.floor(cutoff / self.time_bucket))))

    def _pop_oldest(self, txn: Any, limit: int | None, before_bucket: float | None) -> np.ndarray:
        """Take entry keys from the oldest time buckets (insertion order within a bucket): the first
        ``limit``, or all in buckets before ``before_bucket``. Consumed rows are deleted or trimmed."""
        end = None if before_bucket is None else _seq_bytes(_orderable_time(np.array([before_bucket])))[0]
        chunks: list[np.ndarray] = []
        taken = 0
        with txn.cursor(self._times) as cursor:
            moved = cursor.first()
            while moved and (limit is None or taken < limit):
                key = cursor.key()
                if end is not None and key[:8] >= end:
                    break
                if self._txn.undo is not None:
                    self._txn.undo.times.setdefault(key, cursor.value())
                spans = np.frombuffer(cursor.value(), dtype=_U64).astype(np.uint64).reshape(-1, 2)
                members = np.concatenate([np.arange(a, b, dtype=np.uint64) for a, b in spans.tolist()])
                if limit is not None and taken + len(members) > limit:
                    keep = members[limit - taken :]
                    members = members[: limit - taken]
                    breaks = np.flatnonzero(np.diff(keep) != 1) + 1
                    rest = np.stack([keep[np.concatenate([[0], breaks])], keep[np.concatenate([breaks - 1, [len(keep) - 1]])] + np.uint64(1)], axis=1)
                    cursor.put(key, rest.astype(_U64).tobytes())
                    moved = False
                else:
                    # delete() steps to the successor; past the last row the cursor holds no key.
                    cursor.delete()
                    moved = bool(cursor.key())
                chunks.append(members)
                taken += len(members)
        return np.concatenate(chunks) if chunks else np.zeros(0, np.uint64)

    def _remove_in(self, txn: Any, seqs: np.ndarray) -> int:
        if not len(seqs):
            return 0
        entries, head, ids = self._fetch(txn, seqs)
        n = len(entries)
        if not n:
            return 0
        seq_keys = _seq_bytes(entries)
        mirror = self._table_mirror(txn)
        if mirror is not None:
            mirror.records.forget(seq_keys)
        id_bytes = [x.encode() for x in ids]
        id_keys = self._id_keys(id_bytes)
        undo = self._txn.undo
        if undo is not None:
            undo.removed_seqs.append(entries)
            undo.removed_heads.append(head)
            undo.removed_ids.extend(id_bytes)
        for i in range(n):
            txn.delete(seq_keys[i], db=self._entries)
            txn.delete(id_keys[i], db=self._ids)
        for key in self._origin_keys(head[head["topic"] != NO_TOPIC]):
            txn.delete(key, db=self._origins)
        if self._entry_valued:
            # Each entry has rows of its own, and they stay, staged or merged, until their table is swept: a
            # lookup reads every candidate's record and drops those of removed entries. Deleting them here
            # dirtied a random page of every table per entry, which each commit wrote out again.
            unswept = self._unswept(txn) + np.uint64(n)
            txn.put(_META_UNSWEPT, unswept.astype(_U64).tobytes(), db=self._meta)
        else:
            self._remove_fold_rows(txn, seq_keys, head)
        txn.put(_META_COUNT, (self._counter(txn, _META_COUNT) - n).to_bytes(8, "big"), db=self._meta)
        return n

    def _remove_fold_rows(self, txn: Any, seq_keys: list[bytes], head: np.ndarray) -> None:
        """Delete removed entries' folds (entry keys and records given), and the table rows of folds no surviving
        entry shares."""
        n = len(head)
        keys, values, folds = table_rows(self.plan, head["fp"].reshape(n, self.words).astype(np.uint64))
        fold_keys = _seq_bytes(folds)
        for i in range(n):
            txn.delete(fold_keys[i], seq_keys[i], db=self._folds)
        with txn.cursor(self._folds) as cursor:
            survivors = cursor.getmulti(_seq_bytes(np.unique(folds)), dupdata=True, dupfixed_bytes=8, keyfixed=True)
        survivor_rows = np.frombuffer(survivors, dtype=np.uint8).reshape(-1, 16)
        survivor_seqs = survivor_rows[:, 8:].copy().view(_U64).astype(np.uint64).ravel()
        if len(survivor_seqs):
            survivor_keys, survivor_values, _ = table_rows(self.plan, self._records(txn, survivor_seqs).fingerprints)
        for table, stored_table in enumerate(self._tables):
            doomed_keys, doomed_values = keys[table], values[table]
            if len(survivor_seqs):
                doomed = ~rows_in(doomed_keys, doomed_values, survivor_keys[table], survivor_values[table])
                doomed_keys, doomed_values = doomed_keys[doomed], doomed_values[doomed]
            if self._txn.undo is not None:
                self._txn.undo.table_rows.append((table, *self._rows_present(txn, table, doomed_keys, doomed_values)))
            stored_table.delete(txn, doomed_keys, doomed_values)
            self._drop_staged(txn, table, doomed_keys, doomed_values)

    def _unswept(self, txn: Any) -> np.ndarray:
        """Per table, the entries removed since it was last swept (an entry-valued index's)."""
        raw = txn.get(_META_UNSWEPT, db=self._meta)
        return np.frombuffer(raw, dtype=_U64).astype(np.uint64) if raw else np.zeros(len(self._tables), np.uint64)

    def _sweep_due(self, txn: Any, table: int) -> bool:
        """Whether a table may hold as many rows of removed entries as of live ones, times 1 to 2 (staggered over
        the tables, so that their sweeps fall on different batches): a sweep then reads at most three rows and
        writes at most one per removal."""
        unswept = int(self._unswept(txn)[table])
        return unswept * len(self._tables) >= max(self._counter(txn, _META_COUNT), 1) * (len(self._tables) + table)

    def _sweep(self, txn: Any, table: int, keys: np.ndarray, values: np.ndarray) -> None:
        """Rewrite an entry-valued table with its stored rows and these (its staged rows and a batch's, keys
        ascending within each), leaving out the rows of removed entries. The stored rows come from the table's
        copy in memory when there is one (reading them from LMDB costs ~0.75 us a row)."""
        stored_table = self._tables[table]
        mirror = self._table_mirror(txn)
        mirrored = mirror.tables[table] if mirror is not None else None
        stored_keys, stored_values = (mirrored.keys, mirrored.values) if mirrored is not None else stored_table.rows(txn)
        keys, values = np.concatenate([stored_keys, keys]), np.concatenate([stored_values, values])
        with txn.cursor(self._entries) as cursor:
            live = np.frombuffer(b"".join(cursor.iternext(keys=True, values=False)), dtype=_U64).astype(np.uint64)
        # Rows of entries a rollback may restore stay, so that a restored entry is found as before.
        live = np.union1d(live, self._undoable_seqs(txn))
        alive = np.isin(values, live, assume_unique=True)
        keys, values = keys[alive], values[alive]
        # Within a key, rows come in entry order (a table takes its rows batch after batch), which is the value
        # order LMDB keeps; a stable sort of already sorted runs only merges them.
        order = np.argsort(keys, kind="stable")
        stored_table.replace(txn, keys[order], values[order])
        if mirror is not None:
            self._txn.mirror = mirror.with_table(table, SortedRows(keys[order], values[order], stored_table.key_bits))
        unswept = self._unswept(txn)
        unswept[table] = 0
        txn.put(_META_UNSWEPT, unswept.astype(_U64).tobytes(), db=self._meta)

    # ----------------------------------------------------------------- sources and rollback

    def source_offsets(self) -> dict[tuple[str, int], int]:
        with self._read() as txn:
            return self._sources_in(txn)

    def _sources_in(self, txn: Any) -> dict[tuple[str, int], int]:
        if self._sources is None:
            return {}
        topics = self._topic_names(txn)
        with txn.cursor(self._sources) as cursor:
            return {
                (topics[int.from_bytes(k[:4], "big")], int.from_bytes(k[4:], "big")): int.from_bytes(v, "big")
                for k, v in cursor
            }

    def rollback(self, offsets: Mapping[tuple[str, int], int]) -> int:
        """Remove entries whose origin offset >= offsets[(topic, partition)] and reset those source offsets;
        returns how many were removed.

        The newest batches whose entries all come from those offsets on are undone whole, from their undo records
        (the last ``UNDO_BATCHES``): what they removed (expiry, eviction, a re-added id) comes back, and so do the
        clock and the expiry rows, so that a replay of their records meets the index the first run met. Entries
        of an older batch, or of one only partly rolled back, are removed alone; nothing is undone after that."""

        def work(txn: Any) -> int:
            topic_ids = self._topic_ids(txn, (topic for topic, _ in offsets))
            targets = {(topic_ids[topic], int(partition)): int(offset) for (topic, partition), offset in offsets.items()}
            removed = 0
            for key, raw in self._undo_newest_first(txn):
                record = _UndoRecord.unpack(raw, self._record)
                added = self._seqs_from(txn, record.first_seq)
                if not self._rolled_back(txn, added, record, targets):
                    break
                removed += self._undo_batch(txn, key, record, added)
            left = self._doomed(txn, targets)
            if len(left):
                removed += self._remove_in(txn, left)
                self._forget_undo(txn)
            self._put_sources(txn, offsets)
            return removed

        return self._write(work)

    def _doomed(self, txn: Any, targets: Mapping[tuple[int, int], int]) -> np.ndarray:
        """Entry keys of the entries whose origin is at or past its partition's target offset."""
        doomed = []
        with txn.cursor(self._origins) as cursor:
            for (topic_id, partition), offset in targets.items():
                prefix = topic_id.to_bytes(4, "big") + partition.to_bytes(4, "big")
                moved = cursor.set_range(prefix + offset.to_bytes(8, "big"))
                while moved and cursor.key()[:8] == prefix:
                    doomed.append(cursor.value())
                    moved = cursor.next()
        return np.frombuffer(b"".join(doomed), dtype=_U64).astype(np.uint64)

    def _seqs_from(self, txn: Any, first_seq: int) -> np.ndarray:
        """Entry keys of the stored entries from ``first_seq`` on."""
        with txn.cursor(self._entries) as cursor:
            if not cursor.set_range(_seq_bytes(np.array([first_seq]))[0]):
                return np.zeros(0, np.uint64)
            keys = b"".join(cursor.iternext(keys=True, values=False))
        return np.frombuffer(keys, dtype=_U64).astype(np.uint64)

    def _rolled_back(
        self, txn: Any, added: np.ndarray, record: _UndoRecord, targets: Mapping[tuple[int, int], int]
    ) -> bool:
        """Whether every entry the newest batch left to undo stored (``added``, those still stored, and those it
        removed itself) comes from a rolled-back offset."""
        _, heads, _ = self._fetch(txn, added)
        heads = np.concatenate([heads, record.heads[record.seqs >= np.uint64(record.first_seq)]])
        if not len(heads):
            return False
        for topic, partition, offset in zip(heads["topic"].tolist(), heads["partition"].tolist(), heads["offset"].tolist()):
            target = targets.get((topic, partition)) if topic != NO_TOPIC else None
            if target is None or offset < target:
                return False
        return True

    def _undo_batch(self, txn: Any, key: bytes, record: _UndoRecord, added: np.ndarray) -> int:
        """Remove a batch's entries and put back what it changed; returns how many of its entries were stored."""
        removed = self._remove_in(txn, added)
        older = record.seqs < np.uint64(record.first_seq)
        self._restore(txn, record.seqs[older], record.heads[older], [i for i, old in zip(record.ids, older.tolist()) if old])
        tables, row_keys, row_values = record.rows
        for table in np.unique(tables).tolist():
            mine = tables == table
            keys, values = row_keys[mine], row_values[mine]
            present_keys, present_values = self._rows_present(txn, table, keys, values)
            wanted = ~rows_in(keys, values, present_keys, present_values)
            if wanted.any():
                pairs = np.unique(np.stack([keys[wanted], values[wanted]], axis=1), axis=0)
                self._tables[table].insert(txn, pairs[:, 0].copy(), pairs[:, 1].copy())
        for time_key, value in record.times:
            if value is None:
                txn.delete(time_key, db=self._times)
            else:
                txn.put(time_key, value, db=self._times)
        for meta_key, value in ((_META_CLOCK, record.clock), (_META_CLOCK_WINDOW, record.window)):
            if value is None:
                txn.delete(meta_key, db=self._meta)
            else:
                txn.put(meta_key, value, db=self._meta)
        txn.put(_META_COUNT, record.count.to_bytes(8, "big"), db=self._meta)
        txn.delete(key, db=self._undo)
        return removed

    def _restore(self, txn: Any, seqs: np.ndarray, heads: np.ndarray, id_bytes: list[bytes]) -> None:
        """Put back removed entries as they were (their records, ids, origins and folds), and their keys in the
        key filter. An entry-valued table still holds their rows (sweeps keep them while they can be restored)."""
        if not len(seqs):
            return
        seq_keys = _seq_bytes(seqs)
        with txn.cursor(self._entries) as cursor:
            cursor.putmulti(zip(seq_keys, map(bytes.__add__, heads.view(f"V{self._record.itemsize}").tolist(), id_bytes)))
        with txn.cursor(self._ids) as cursor:
            cursor.putmulti(zip(self._id_keys(id_bytes), seq_keys))
        with_origin = heads["topic"] != NO_TOPIC
        with txn.cursor(self._origins) as cursor:
            cursor.putmulti(zip(self._origin_keys(heads[with_origin]), compress(seq_keys, with_origin.tolist())))
        keys, _, folds = table_rows(self.plan, heads["fp"].reshape(len(heads), self.words).astype(np.uint64))
        if not self._entry_valued:
            with txn.cursor(self._folds) as cursor:
                cursor.putmulti(zip(_seq_bytes(folds), seq_keys))
        self._keys_added(txn, keys)

    def _keys_added(self, txn: Any, keys: np.ndarray) -> int:
        """Count a write that adds table keys ((tables, n)), which a saved key filter then lacks, and mark them
        in the writer's filter; returns the count of such writes before it."""
        self._table_mirror(txn)  # taken up at the count before this write moves it
        keyed = self._counter(txn, _META_KEYED_WRITES)
        txn.put(_META_KEYED_WRITES, (keyed + 1).to_bytes(8, "big"), db=self._meta)
        txn.delete(_META_KEY_FILTER_TOKEN, db=self._meta)
        if self._key_filter is not None:
            # Bits set now stay set if the write aborts: harmless, a set bit only sends a key on to LMDB.
            self._key_filter.add(keys)
            self._txn.filtered.append((self._key_filter, keyed))
        return keyed

    def _rows_present(self, txn: Any, table: int, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows among these that ``table`` holds, merged or staged."""
        if not len(keys):
            return keys, values
        unique = np.unique(keys)
        owners, found = self._tables[table].read(txn, unique)
        present = rows_in(keys, values, unique[owners], found)
        staged = self._staged(txn)[table]
        if len(staged):
            present |= rows_in(keys, values, staged.keys, staged.values)
        return keys[present], values[present]

    def _save_undo(self, txn: Any) -> None:
        """Store the undo record of the batch this transaction stores, and drop the oldest beyond UNDO_BATCHES."""
        undo, self._txn.undo = self._txn.undo, None
        if undo is None:
            return
        txn.put(_seq_bytes(np.array([undo.first_seq]))[0], undo.pack(), db=self._undo)
        if txn.stat(self._undo)["entries"] > UNDO_BATCHES:
            with txn.cursor(self._undo) as cursor:
                if cursor.first():
                    cursor.delete()

    def _undo_newest_first(self, txn: Any) -> Iterator[tuple[bytes, bytes]]:
        with txn.cursor(self._undo) as cursor:
            records = list(cursor.iterprev()) if cursor.last() else []
        return iter(records)

    def _undoable_seqs(self, txn: Any) -> np.ndarray:
        """Entry keys of the removed entries a rollback may restore."""
        seqs = [_UndoRecord.unpack(raw, self._record).seqs for _, raw in self._undo_newest_first(txn)]
        return np.unique(np.concatenate(seqs)) if seqs else np.zeros(0, np.uint64)

    def _forget_undo(self, txn: Any) -> None:
        """Drop every undo record: after a removal outside a batch, undoing an older batch would not restore
        the index it met."""
        txn.drop(self._undo, delete=False)

    # ----------------------------------------------------------------- size, stats, maintenance

    def __len__(self) -> int:
        with self._read() as txn:
            return self._counter(txn, _META_COUNT)

    def disk_bytes(self) -> dict[str, int]:
        """Bytes in use per database, from LMDB's own page counts (not the sparse file size)."""
        out = {}
        with self._read() as txn:
            for name, db in self._named_dbs():
                stat = txn.stat(db)
                out[name] = (stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]) * stat["psize"]
        return out

    def _named_dbs(self) -> list[tuple[str, Any]]:
        dbs = [(f"{names.INDEX_DB_TABLE_PREFIX}{t}", table.db) for t, table in enumerate(self._tables)]
        dbs += [
            (names.INDEX_DB_STAGED, self._staged_db),
            (names.INDEX_DB_FOLDS, self._folds),
            (names.INDEX_DB_ENTRIES, self._entries),
            (names.INDEX_DB_IDS, self._ids),
            (names.INDEX_DB_TIMES, self._times),
            (names.INDEX_DB_ORIGINS, self._origins),
            (names.INDEX_DB_SOURCES, self._sources),
            (names.INDEX_DB_TOPICS, self._topics),
            (names.INDEX_DB_UNDO, self._undo),
            (names.INDEX_DB_META, self._meta),
        ]
        return [(name, db) for name, db in dbs if db is not None]

    def usage(self) -> dict[str, int]:
        """What the index holds and occupies: entries, disk_bytes (LMDB pages in use), map_size, and this writer's
        copies in memory (mirrored_tables of the merged tables, and the records read lately: mirror_bytes in all).
        Cheap enough for a service to refresh every few seconds, unlike ``stats`` (its plan's recall table)."""
        with self._read() as txn:
            count = self._counter(txn, _META_COUNT)
        mirror = self._mirror
        mirrored = [rows for rows in mirror.tables if rows is not None] if mirror is not None else []
        records = 0 if mirror is None else len(mirror.records) * MIRROR_RECORD_BYTES
        return {
            "entries": count,
            "disk_bytes": sum(self.disk_bytes().values()),
            "map_size": self.env.info()["map_size"],
            "mirrored_tables": len(mirrored),
            "mirror_bytes": sum(rows.nbytes for rows in mirrored) + records,
        }

    def stats(self) -> dict[str, Any]:
        disk = self.disk_bytes()
        with self._read() as txn:
            count = self._counter(txn, _META_COUNT)
            clock = self._clock(txn)
            sources = self._sources_in(txn)
            with txn.cursor(self._times) as cursor:
                first_key = cursor.key() if cursor.first() else None
            staged_rows = sum(map(len, self._staged(txn)))
            unswept = int(self._unswept(txn).max(initial=0)) if self._entry_valued else 0
            undoable = txn.stat(self._undo)["entries"] if self._undo is not None else 0
        table_bytes = sum(v for k, v in disk.items() if k.startswith(names.INDEX_DB_TABLE_PREFIX))
        return {
            "path": str(self.path),
            "entries": count,
            "plan": self.plan.describe(),
            "table_values": _ENTRY_VALUES if self._entry_valued else _FOLD_VALUES,
            "table_layout": self._table_layout,
            "payload_bytes": self.payload_bytes,
            # How the stored fingerprints and payloads were made (None: not recorded, an older index).
            "signing": self.signing,
            "max_age": self.max_age,
            "max_entries": self.max_entries,
            # Expiry's clock: the median event time of the latest CLOCK_WINDOW entries (never moving back).
            "clock": None if clock == -math.inf else clock,
            "oldest_bucket_start": None if first_key is None else _bucket_start(first_key, self.time_bucket),
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
        with self._read() as txn, txn.cursor(self._entries) as cursor:
            keys = cursor.iternext(keys=True, values=False)
            while chunk := list(islice(keys, 10_000)):
                records = self._records(txn, np.frombuffer(b"".join(chunk), dtype=_U64).astype(np.uint64))
                for i, entry_id in enumerate(records.ids):
                    yield {
                        "id": entry_id,
                        "fingerprint": "".join(f"{int(w):016x}" for w in records.fingerprints[i]),
                        "time": float(records.times[i]),
                        "origin": list(records.origins[i]) if records.origins[i] else None,
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
        self._open_dbs_after_reopen()
        return before, (self.path / "data.mdb").stat().st_size

    def _open_dbs_after_reopen(self) -> None:
        self._meta = self._db(names.INDEX_DB_META)
        self._open_dbs()
        self._key_filter, self._key_filter_pointless = None, False

    def close(self) -> None:
        """Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._save_key_filter()
        if not self.sync and not self.readonly:
            # Without a sync per commit, one flush at the end leaves the file complete on disk.
            self.env.sync(True)
        self.env.close()

    def __enter__(self) -> SegmentIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def planned(settings: IndexSettings, *, bits: int, segments: int = 1) -> IndexPlan:
    """The table plan a new index under ``settings`` gets (``segments`` > 1: one table per segment)."""
    if segments > 1:
        return make_segment_plan(bits, segments, settings.radius, expected_entries=settings.expected_entries)
    radius = bits if settings.radius is None else settings.radius
    return make_plan(bits, radius, settings.expected_entries, max_tables=settings.max_tables)


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


def _bucket_start(key: bytes, width: float) -> float:
    raw = np.frombuffer(key[:8], dtype=_U64).astype(np.uint64)
    # Invert _orderable_time: the top bit tells the sign of the original float.
    bits = np.where(raw >> np.uint64(63), raw & ~np.uint64(1 << 63), ~raw)
    return float(bits.view(np.float64)[0]) * width


def _distinct_pairs(rows: np.ndarray, named: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (row, named) pairs, sorted, and how many times each came (through how many tables)."""
    word = packed([rows, named]) if len(rows) else None
    if word is not None:
        pairs, shared = np.unique(word[0], return_counts=True)
        named_bits = word[1][1]
        return (pairs >> np.uint64(named_bits)).astype(np.int64), pairs & np.uint64((1 << named_bits) - 1), shared
    order = np.lexsort((named, rows))
    rows, named = rows[order], named[order]
    first = np.concatenate([[True], (rows[1:] != rows[:-1]) | (named[1:] != named[:-1])])
    shared = np.diff(np.append(np.flatnonzero(first), len(first)))
    return rows[first].astype(np.int64), named[first], shared


def _subset(batch: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    def part(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return value[rows]
        if isinstance(value, TableKeys):
            return value.subset(rows)
        return [value[i] for i in rows.tolist()]

    return {k: part(v) for k, v in batch.items()}


def _reorder(records: EntryRecords, order: np.ndarray) -> EntryRecords:
    return EntryRecords(
        records.entries[order],
        records.ids.take(order),
        records.fingerprints[order],
        records.times[order],
        records.payloads[order],
        records.origin_rows[order],
        records.topic_names,
    )
