"""The index's LMDB databases as one open store, the encodings of their keys, and the small rows every part of
the index reads: the ``meta`` counters, the clock, topic ids and source offsets."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from typing import Any

import lmdb
import numpy as np

from .. import names
from .format import IndexFormat
from .packed_ids import PackedIds
from .record import NO_TOPIC
from .table import BIG_ENDIAN_U64 as U64
from .table import DuplicateRows, PackedBuckets, SortedRuns, table_class

__all__ = [
    "MAX_ID_KEY_BYTES",
    "NO_TOPIC",
    "U64",
    "IndexStorageError",
    "Store",
    "bucket_start",
    "id_hashes",
    "keys_of_ids",
    "mixed_in",
    "orderable_time",
    "origin_keys",
    "seq_bytes",
]

MAX_ID_KEY_BYTES = 480  # LMDB keys stop at 511 bytes; longer ids are keyed by their BLAKE2b digest.
# An id key's length and first bytes are what its hash mixes: ids that share them share a key filter bit, no more.
_ID_HASHED_BYTES = 64
_MIX = np.uint64(0xFF51AFD7ED558CCD)
META_NEXT_SEQ = b"next_seq"
META_COUNT = b"count"
META_CLOCK = b"clock"
META_CLOCK_WINDOW = b"clock_window"  # event times of the latest entries added, whose median moves the clock
META_NEXT_TOPIC = b"next_topic"
META_STAGED_GENERATION = b"staged_generation"
META_NEXT_MERGE = b"next_merge"
META_UNSWEPT = b"unswept"  # per table: entries removed since the table was last swept (entry-valued tables)
META_UNSWEPT_IDS = b"unswept_ids"  # entries removed since the ids were last swept (the ``runs`` id layout)
META_UNSWEPT_CONTENTS = b"unswept_contents"  # entries removed since the contents were last swept
META_KEYED_WRITES = b"keyed_writes"  # batches that added table rows: what a key filter is valid for
META_KEY_FILTER_TOKEN = b"key_filter_token"  # names the saved key filter; deleted by every batch that adds keys
META_SKIPPED = b"skipped"  # entry keys that undone batches had taken, as (start, stop) runs: no document's any more


class Store:
    """The databases of one open environment under one format (None: a database a read-only open did not find)."""

    def __init__(self, env: Any, fmt: IndexFormat, *, readonly: bool) -> None:
        self.env = env
        self.fmt = fmt
        self.readonly = readonly
        self.meta = self._db(names.INDEX_DB_META)
        layout = table_class(fmt.table_layout)
        self.tables: list[DuplicateRows | PackedBuckets | SortedRuns] = [
            layout(env, self._db(f"{names.INDEX_DB_TABLE_PREFIX}{t}", **layout.flags), len(key), key_bytes, value_bytes)
            for t, (key, key_bytes, value_bytes) in enumerate(
                zip(fmt.plan.tables, fmt.key_bytes, fmt.value_bytes, strict=True)
            )
        ]
        self.staged = self._db(names.INDEX_DB_STAGED)
        self.folds = self._db(names.INDEX_DB_FOLDS, **DuplicateRows.flags)
        self.times = self._db(names.INDEX_DB_TIMES)
        self.entries = self._db(names.INDEX_DB_ENTRIES)
        self.ids = self._db(names.INDEX_DB_IDS)
        self.contents = self._db(names.INDEX_DB_CONTENTS) if fmt.contents else None
        self.origins = self._db(names.INDEX_DB_ORIGINS)
        self.sources = self._db(names.INDEX_DB_SOURCES)
        self.topics = self._db(names.INDEX_DB_TOPICS)
        self.undo = self._db(names.INDEX_DB_UNDO)

    def entry_table(self, table: int) -> DuplicateRows | SortedRuns:
        """A table of an entry-valued index, which is in the ``runs`` layout (``rows`` before format 6)."""
        stored = self.tables[table]
        if isinstance(stored, PackedBuckets):
            raise TypeError(f"table {table} of an entry-valued index is in the buckets layout")
        return stored

    def _db(self, name: str, **flags: Any) -> Any:
        return open_db(self.env, name, readonly=self.readonly, **flags)

    def missing(self) -> bool:
        """Whether databases every index has are missing (it is not a streamdedup index)."""
        return any(db is None for db in (*(table.db for table in self.tables), self.folds, self.entries))

    def named(self) -> list[tuple[str, Any]]:
        dbs = [(f"{names.INDEX_DB_TABLE_PREFIX}{t}", table.db) for t, table in enumerate(self.tables)]
        dbs += [
            (names.INDEX_DB_STAGED, self.staged),
            (names.INDEX_DB_FOLDS, self.folds),
            (names.INDEX_DB_ENTRIES, self.entries),
            (names.INDEX_DB_IDS, self.ids),
            (names.INDEX_DB_CONTENTS, self.contents),
            (names.INDEX_DB_TIMES, self.times),
            (names.INDEX_DB_ORIGINS, self.origins),
            (names.INDEX_DB_SOURCES, self.sources),
            (names.INDEX_DB_TOPICS, self.topics),
            (names.INDEX_DB_UNDO, self.undo),
            (names.INDEX_DB_META, self.meta),
        ]
        return [(name, db) for name, db in dbs if db is not None]

    # ----------------------------------------------------------------- meta rows

    def counter(self, txn: Any, key: bytes) -> int:
        raw = txn.get(key, db=self.meta)
        return int.from_bytes(raw, "big") if raw else 0

    def put_counter(self, txn: Any, key: bytes, value: int) -> None:
        txn.put(key, int(value).to_bytes(8, "big"), db=self.meta)

    def clock(self, txn: Any) -> float:
        raw = txn.get(META_CLOCK, db=self.meta)
        return float(np.frombuffer(raw, dtype=np.float64)[0]) if raw else -math.inf

    def clock_window(self, txn: Any) -> np.ndarray:
        raw = txn.get(META_CLOCK_WINDOW, db=self.meta)
        return np.frombuffer(raw, dtype=np.float64) if raw else np.zeros(0, dtype=np.float64)

    def skipped(self, txn: Any) -> np.ndarray:
        raw = txn.get(META_SKIPPED, db=self.meta)
        return np.frombuffer(raw, dtype=U64).astype(np.uint64).reshape(-1, 2) if raw else np.zeros((0, 2), np.uint64)

    def put_skipped(self, txn: Any, runs: np.ndarray) -> None:
        txn.put(META_SKIPPED, runs.astype(U64).tobytes(), db=self.meta)

    def kept_after(self, txn: Any, seqs: np.ndarray) -> np.ndarray:
        """How many kept documents were stored after each of these entry keys: later keys, less those undone
        batches had taken (an undone batch's keys are not reused: its entries' table rows may linger)."""
        seqs = np.asarray(seqs, dtype=np.int64)
        later = self.counter(txn, META_NEXT_SEQ) - 1 - seqs
        runs = self.skipped(txn).astype(np.int64)
        if not len(runs):
            return later
        # Runs ascend; the keys skipped above an entry are those of the runs that start after it.
        skipped_from = np.cumsum((runs[:, 1] - runs[:, 0])[::-1])[::-1]
        first_after = np.searchsorted(runs[:, 0], seqs, side="right")
        return later - np.append(skipped_from, 0)[first_after]

    def unswept(self, txn: Any) -> np.ndarray:
        """Per table, the entries removed since it was last swept (an entry-valued index's)."""
        raw = txn.get(META_UNSWEPT, db=self.meta)
        return np.frombuffer(raw, dtype=U64).astype(np.uint64) if raw else np.zeros(len(self.tables), np.uint64)

    def put_unswept(self, txn: Any, unswept: np.ndarray) -> None:
        txn.put(META_UNSWEPT, unswept.astype(U64).tobytes(), db=self.meta)

    # ----------------------------------------------------------------- records

    def stored_records(
        self, txn: Any, seqs: np.ndarray, *, payloads: bool = True
    ) -> tuple[np.ndarray, np.ndarray, PackedIds]:
        """Of these entry keys (ascending, distinct), those stored, with their records' heads and ids (see
        ``RecordLayout.decode`` for ``payloads``)."""
        # One get a key: a third cheaper than a cursor's getmulti, which builds a (key, value) pair for each.
        get, entries_db = txn.get, self.entries
        records = [get(key, db=entries_db) for key in seq_bytes(seqs)]
        found = [record for record in records if record is not None]
        # Every key found (the usual case): the entries are the keys asked for.
        entries = (
            seqs
            if len(found) == len(seqs)
            else seqs[np.fromiter((record is not None for record in records), dtype=bool, count=len(records))]
        )
        head, ids = self.fmt.records.decode(found, payloads=payloads)
        return entries, head, ids

    # ----------------------------------------------------------------- topics and source offsets

    def topic_ids(self, txn: Any, topics: Iterable[str]) -> dict[str, int]:
        out = {}
        for topic in set(topics):
            raw = txn.get(topic.encode(), db=self.topics)
            if raw is None:
                topic_id = self.counter(txn, META_NEXT_TOPIC)
                self.put_counter(txn, META_NEXT_TOPIC, topic_id + 1)
                raw = topic_id.to_bytes(4, "big")
                txn.put(topic.encode(), raw, db=self.topics)
            out[topic] = int.from_bytes(raw, "big")
        return out

    def topic_names(self, txn: Any) -> dict[int, str]:
        with txn.cursor(self.topics) as cursor:
            return {int.from_bytes(v, "big"): k.decode() for k, v in cursor}

    def source_offsets(self, txn: Any) -> dict[tuple[str, int], int]:
        if self.sources is None:
            return {}
        topics = self.topic_names(txn)
        with txn.cursor(self.sources) as cursor:
            return {
                (topics[int.from_bytes(k[:4], "big")], int.from_bytes(k[4:], "big")): int.from_bytes(v, "big")
                for k, v in cursor
            }

    def put_source_offsets(self, txn: Any, source_offsets: Mapping[tuple[str, int], int]) -> None:
        topic_ids = self.topic_ids(txn, (topic for topic, _ in source_offsets))
        for (topic, partition), offset in source_offsets.items():
            key = topic_ids[topic].to_bytes(4, "big") + int(partition).to_bytes(4, "big")
            txn.put(key, int(offset).to_bytes(8, "big"), db=self.sources)


def open_db(env: Any, name: str, *, readonly: bool, **flags: Any) -> Any:
    try:
        return env.open_db(name.encode(), create=not readonly, **flags)
    except lmdb.NotFoundError:
        return None


class IndexStorageError(RuntimeError):
    """A batch could not be stored (disk full, map at its limit); nothing committed before it is lost."""


# ----------------------------------------------------------------- key encodings


def seq_bytes(seqs: np.ndarray) -> list[bytes]:
    """Entry keys (or folds) as big-endian LMDB keys, which sort as the numbers do."""
    return np.ascontiguousarray(seqs, dtype=U64).view("V8").tolist()


def keys_of_ids(id_bytes: list[bytes]) -> list[bytes]:
    if max(map(len, id_bytes), default=0) <= MAX_ID_KEY_BYTES:
        return id_bytes
    return [
        b if len(b) <= MAX_ID_KEY_BYTES else b"\xff#" + hashlib.blake2b(b, digest_size=32).digest() for b in id_bytes
    ]


def id_hashes(id_keys: list[bytes], hashed_bytes: int = _ID_HASHED_BYTES) -> np.ndarray:
    """A 64-bit hash of each id key's length and first ``hashed_bytes`` bytes, over the whole batch at once: the
    ids padded to one width and mixed eight bytes at a time, each id's words only (so an id hashes alike in any
    batch)."""
    n = len(id_keys)
    lengths = np.fromiter(map(len, id_keys), dtype=np.uint64, count=n)
    hashes = lengths * np.uint64(0x9E3779B97F4A7C15)
    if not n:
        return hashes
    width = max(8, min(-(-hashed_bytes // 8) * 8, -(-int(lengths.max()) // 8) * 8))
    # A fixed-width bytes array pads with zero bytes and cuts longer ids to the width.
    words = np.array(id_keys, dtype=f"S{width}").view("<u8").reshape(n, width // 8)
    for word, column in enumerate(words.T):
        hashes = np.where(lengths > np.uint64(8 * word), mixed_in(hashes, column), hashes)
    return hashes


def mixed_in(hashes: np.ndarray, words: np.ndarray | np.uint64) -> np.ndarray:
    """64-bit hashes with one more 64-bit word of each mixed in."""
    mixed = (hashes ^ words) * _MIX
    mixed ^= mixed >> np.uint64(32)
    return mixed


def origin_keys(head: np.ndarray) -> list[bytes]:
    """(topic id, partition, offset) big-endian, so one partition's entries sort by offset."""
    keys = np.zeros(len(head), dtype=[("topic", ">u4"), ("partition", ">u4"), ("offset", ">u8")])
    keys["topic"], keys["partition"], keys["offset"] = head["topic"], head["partition"], head["offset"]
    return keys.view("V16").tolist()


def orderable_time(times: np.ndarray) -> np.ndarray:
    """float64 -> uint64 whose unsigned order is the float order (negative times included)."""
    raw = np.ascontiguousarray(times, dtype=np.float64).view(np.uint64)
    negative = (raw >> np.uint64(63)).astype(bool)
    return np.where(negative, ~raw, raw | np.uint64(1 << 63))


def time_buckets(times: np.ndarray, width: float) -> np.ndarray:
    """The ``times`` rows' keys of these event times: their bucket numbers, orderable."""
    return orderable_time(np.floor(times / width))


def bucket_start(key: bytes, width: float) -> float:
    raw = np.frombuffer(key[:8], dtype=U64).astype(np.uint64)
    # Invert orderable_time: the top bit tells the sign of the original float.
    bits = np.where(raw >> np.uint64(63), raw & ~np.uint64(1 << 63), ~raw)
    return float(bits.view(np.float64)[0]) * width
