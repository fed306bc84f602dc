"""One index table: (key, value) rows of unsigned integers, each a fixed number of big-endian bytes, in one LMDB
database, laid out one of three ways (the index stores which):

- ``runs`` (:class:`SortedRuns`): immutable runs of rows sorted by key, each run one LMDB value (its keys packed
  end to end, then its values), which LMDB keeps on contiguous pages. A merge writes its rows as a new run, and
  runs merge as they grow (the newest four into one, once they hold about as many rows each: ``RUNS_MERGED``), so
  a row is rewritten about log4(table / merge) times and a table holds up to three runs of each size. A merge that
  would merge every run into one waits for a turn that may rewrite the table (``merge_due``): the writer spreads
  those turns (``writes.REWRITE_ROUNDS``). A B-tree merge (``rows``) instead inserts its rows at random places:
  once a table has more pages than a merge has rows, every row dirties a page of its own, which the commit writes
  out again. A run is searched in place in LMDB's map, through a read transaction whose values are buffers: a
  bitmap of its keys at 8 bits a row says which runs a probe skips (about one in nine of those without the key
  passes), a directory of every 64th key narrows a probe to 64 rows, and seven steps of bisection, every probe at
  once, find its rows there. A lookup reads the pages its probes touch and nothing else, whatever the run's size,
  and costs no B-tree descent per probe. Bitmap and directory are stored with the run and kept in memory once
  read. Entry-valued tables use it from format 6 on (stored whole from format 10): about 11 bytes a row, against
  31 in ``rows``.
- ``rows`` (:class:`DuplicateRows`): ``dupsort`` + ``dupfixed``, one LMDB row per table row, each bucket read as
  one packed array by ``getmulti``. A key with one row is a plain node, so this suited tables whose keys hold
  about one row each: the entry-valued tables of every index written before format 6.
- ``buckets`` (:class:`PackedBuckets`): one LMDB row per key, its value the key's table values packed end to
  end. A dupsort key of many rows pays a 16-byte sub-page header and up to four rows of slack on top of its
  node, and sub-pages growing in place split leaf pages half empty: under the 1M-entry 64-bit plan (four
  tables of 16-bit keys, ~15 rows a key) merged tables took 12.1-13.4 bytes a row as ``rows`` and take
  7.0-7.3 as buckets. A merge that reaches most buckets rewrites the table in key order with LMDB's append
  mode, which fills every page; a smaller one reads and writes back the buckets it extends. Fold-valued
  tables use it: their plan cuts keys so that each holds about eight rows or more.

A row added twice is stored once in ``rows`` and twice in ``buckets`` and ``runs`` (a merge appends without
reading what is stored): lookups count a pair once however often it is found, and :meth:`delete` removes every
copy.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import pairwise, starmap
from typing import Any, ClassVar, Literal

import numpy as np

from .sorted_rows import expand_ranges, merged_rows, run_starts
from .transactions import begin_read

__all__ = [
    "BIG_ENDIAN_U64",
    "DuplicateRows",
    "PackedBuckets",
    "SortedRuns",
    "TableLayout",
    "bytes_int",
    "int_bytes",
    "int_rows",
    "rows_in",
    "table_class",
]

TableLayout = Literal["rows", "buckets", "runs"]
BIG_ENDIAN_U64 = np.dtype(">u8")
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the product's top bits mix every key bit
_MOST_ROWS_AWAITING_MERGE = 1 << 18


def int_rows(ints: np.ndarray, width: int) -> np.ndarray:
    """uint64 -> (n, width) uint8: each one's last ``width`` big-endian bytes (keys and values as LMDB stores
    them)."""
    return np.ascontiguousarray(ints, dtype=BIG_ENDIAN_U64).view(np.uint8).reshape(-1, 8)[:, 8 - width :]


def int_bytes(ints: np.ndarray, width: int) -> list[bytes]:
    return np.ascontiguousarray(int_rows(ints, width)).view(f"V{width}").ravel().tolist()


def bytes_int(rows: np.ndarray) -> np.ndarray:
    """(n, <=8) big-endian byte rows -> uint64 (the inverse of int_bytes)."""
    width = rows.shape[1]
    if width == 8:
        return rows.copy().view(BIG_ENDIAN_U64).ravel().astype(np.uint64)
    padded = np.zeros((len(rows), 8), dtype=np.uint8)
    padded[:, 8 - width :] = rows
    return padded.view(BIG_ENDIAN_U64).ravel().astype(np.uint64)


def _unpack(buffer: bytes, width: int) -> np.ndarray:
    """Big-endian ``width``-byte integers packed end to end -> uint64: each read as the 8-byte word that ends
    with it (a strided view over the buffer behind 8 - width bytes of padding), then masked."""
    if width == 8:
        return np.frombuffer(buffer, BIG_ENDIAN_U64).astype(np.uint64)
    words = np.ndarray(
        (len(buffer) // width,), dtype=BIG_ENDIAN_U64, buffer=bytes(8 - width) + buffer, strides=(width,)
    )
    return words.astype(np.uint64) & np.uint64((1 << (8 * width)) - 1)


def _bucket_owners(found_keys: np.ndarray, probed: np.ndarray) -> np.ndarray:
    """Index in ``probed`` (ascending, distinct) of each found row's key, the rows coming as getmulti returns
    them: each probed key's bucket whole, in key order. One search per bucket, not per row."""
    if not len(found_keys):
        return np.zeros(0, dtype=np.intp)
    starts = run_starts(found_keys)
    sizes = np.diff(np.append(starts, len(found_keys)))
    return np.repeat(np.searchsorted(probed, found_keys[starts]), sizes)


def rows_in(keys: np.ndarray, values: np.ndarray, other_keys: np.ndarray, other_values: np.ndarray) -> np.ndarray:
    """Whether each (key, value) row is one of the other rows: one search of a 64-bit hash of each row among
    the other rows' sorted hashes, confirmed on the rows themselves."""
    if not len(keys) or not len(other_keys):
        return np.zeros(len(keys), dtype=bool)
    other_hashes = _row_hashes(other_keys, other_values)
    order = np.argsort(other_hashes)
    sorted_hashes = other_hashes[order]
    slots = np.minimum(np.searchsorted(sorted_hashes, _row_hashes(keys, values)), len(order) - 1)
    match = order[slots]
    # Two other rows with one hash would hide the second from its equal: a ~2**-64 chance per pair of rows,
    # and the cost is a row left in place (a lookup drops a candidate whose entry is gone).
    return (other_keys[match] == keys) & (other_values[match] == values)


def _row_hashes(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    mixed = keys.astype(np.uint64) * _GOLDEN ^ values.astype(np.uint64)
    mixed ^= mixed >> np.uint64(33)
    mixed *= np.uint64(0xFF51AFD7ED558CCD)
    mixed ^= mixed >> np.uint64(33)
    return mixed


class _Table:
    def __init__(self, env: Any, db: Any, key_bits: int, key_bytes: int, value_bytes: int) -> None:
        self.env = env
        self.db = db
        self.key_bits = key_bits
        self.key_bytes = key_bytes
        self.value_bytes = value_bytes

    def split_rows(self, raw: bytes) -> tuple[np.ndarray, np.ndarray]:
        """Packed (key, value) rows, as ``getmulti`` returns a dupsort bucket and as rows are staged -> keys, values."""
        kb, vb = self.key_bytes, self.value_bytes
        if kb + vb == 8:
            # Key and value fill one big-endian word: split it with a shift and a mask.
            whole = np.frombuffer(raw, dtype=BIG_ENDIAN_U64).astype(np.uint64)
            return whole >> np.uint64(8 * vb), whole & np.uint64((1 << (8 * vb)) - 1)
        # Each key and each value read as the big-endian word that ends where it ends (strided views over the
        # rows behind 8 bytes of padding), then masked: no copy of a column, no padding row by row.
        width = kb + vb
        padded = bytes(8) + raw
        count = len(raw) // width
        if not count:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint64)

        def words_ending_at(end: int, size: int) -> np.ndarray:
            words = np.ndarray((count,), dtype=BIG_ENDIAN_U64, buffer=padded, offset=end, strides=(width,))
            return words.astype(np.uint64) & np.uint64((1 << (8 * size)) - 1 if size < 8 else 2**64 - 1)

        return words_ending_at(kb, kb), words_ending_at(kb + vb, vb)

    def join_rows(self, keys: np.ndarray, values: np.ndarray) -> bytes:
        """The inverse of :meth:`split_rows`."""
        return np.hstack([int_rows(keys, self.key_bytes), int_rows(values, self.value_bytes)]).tobytes()

    def _empty(self) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(0, np.intp), np.zeros(0, np.uint64)


class DuplicateRows(_Table):
    """The ``rows`` layout: a dupsort + dupfixed database."""

    flags: ClassVar[dict[str, bool]] = {"dupsort": True, "dupfixed": True}

    def merge_due(self, txn: Any, rows: int, *, may_rewrite: bool = True) -> bool:
        """Whether a merge of this many staged rows is due at the table's turn: always, as a row costs the same
        in any merge."""
        return True

    def row_count(self, txn: Any) -> int:
        return int(txn.stat(self.db)["entries"])

    def read(self, txn: Any, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The stored rows of these keys (ascending, distinct), bucket after bucket: the index in ``keys`` of
        each row's key, and its value."""
        with txn.cursor(self.db) as cursor:
            raw = cursor.getmulti(
                int_bytes(keys, self.key_bytes), dupdata=True, dupfixed_bytes=self.value_bytes, keyfixed=True
            )
        if not raw:
            return self._empty()
        found_keys, values = self.split_rows(raw)
        return _bucket_owners(found_keys, keys), values

    def insert(self, txn: Any, keys: np.ndarray, values: np.ndarray) -> None:
        """Store rows (keys ascending)."""
        with txn.cursor(self.db) as cursor:
            cursor.putmulti(zip(int_bytes(keys, self.key_bytes), int_bytes(values, self.value_bytes), strict=True))

    def delete(self, txn: Any, keys: np.ndarray, values: np.ndarray) -> None:
        """Remove these rows where stored."""
        for key, value in zip(int_bytes(keys, self.key_bytes), int_bytes(values, self.value_bytes), strict=True):
            txn.delete(key, value, db=self.db)

    def rows(self, txn: Any) -> tuple[np.ndarray, np.ndarray]:
        """Every stored row in key order: keys, values."""
        with txn.cursor(self.db) as cursor:
            return self.split_rows(b"".join(starmap(bytes.__add__, cursor.iternext())))

    def key_chunks(self, txn: Any, size: int) -> Iterator[np.ndarray]:
        """Every stored row's key (a layout only indexes of an old format have: all at once)."""
        del size
        yield self.rows(txn)[0]

    def replace(self, txn: Any, keys: np.ndarray, values: np.ndarray) -> None:
        """Store exactly these rows (sorted by key, then value, none repeated), in place of all stored: written
        in order with LMDB's append mode, which fills every page."""
        txn.drop(self.db, delete=False)
        with txn.cursor(self.db) as cursor:
            _, added = cursor.putmulti(
                zip(int_bytes(keys, self.key_bytes), int_bytes(values, self.value_bytes), strict=True), append=True
            )
        # Append mode skips a value not above the previous one of its key without an error.
        if added != len(keys):
            raise ValueError(f"{len(keys) - added} of {len(keys)} rows repeated, or out of value order within a key")


class PackedBuckets(_Table):
    """The ``buckets`` layout: key -> the key's values packed end to end."""

    flags: ClassVar[dict[str, bool]] = {}

    def merge_due(self, txn: Any, rows: int, *, may_rewrite: bool = True) -> bool:
        """Whether a merge of this many staged rows is due at the table's turn. A merge pays a read and a write
        per bucket it extends, or rewrites the table, so it waits for four rows per bucket stored, or per key the
        table can hold, up to 2**18 rows (a table of longer keys holds few rows per bucket anyway)."""
        buckets = min(txn.stat(self.db)["entries"], 1 << self.key_bits)
        return rows >= min(4 * buckets, _MOST_ROWS_AWAITING_MERGE)

    def read(self, txn: Any, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The stored rows of these keys (ascending, distinct), bucket after bucket: the index in ``keys`` of
        each row's key, and its value."""
        with txn.cursor(self.db) as cursor:
            get = cursor.get
            # One value per key (empty where none is stored), so bucket i is key i's: no keys to build and
            # match back, as getmulti's (key, value) pairs would need.
            buckets = [get(key, b"") for key in int_bytes(keys, self.key_bytes)]
        sizes = np.fromiter(map(len, buckets), dtype=np.int64, count=len(buckets)) // self.value_bytes
        return np.repeat(np.arange(len(keys)), sizes), _unpack(b"".join(buckets), self.value_bytes)

    def insert(self, txn: Any, keys: np.ndarray, values: np.ndarray) -> None:
        """Store rows (keys ascending). Rows for at least half the table's buckets rewrite the whole table in key
        order, which LMDB's append mode packs into full pages (rewriting buckets where they are splits their
        pages as they grow, and leaves them a third empty on average); fewer rows read and write back just the
        buckets they extend."""
        if not len(keys):
            return
        starts = run_starts(keys)
        key_list = int_bytes(keys[starts], self.key_bytes)
        packed = int_rows(values, self.value_bytes).tobytes()
        bounds = (np.append(starts, len(keys)) * self.value_bytes).tolist()
        added = [packed[low:high] for low, high in pairwise(bounds)]
        if 2 * len(key_list) >= txn.stat(self.db)["entries"]:
            with txn.cursor(self.db) as cursor:
                stored = dict(cursor.iternext())
            for key, rows in zip(key_list, added, strict=True):
                stored[key] = stored.get(key, b"") + rows
            txn.drop(self.db, delete=False)
            with txn.cursor(self.db) as cursor:
                cursor.putmulti(sorted(stored.items()), append=True)
            return
        with txn.cursor(self.db) as cursor:
            stored = dict(cursor.getmulti(key_list))
            if stored:
                added = [stored.get(key, b"") + rows for key, rows in zip(key_list, added, strict=True)]
            cursor.putmulti(zip(key_list, added, strict=True))

    def delete(self, txn: Any, keys: np.ndarray, values: np.ndarray) -> None:
        """Remove every copy of these rows: the buckets they are in are rewritten without them, or deleted."""
        if not len(keys):
            return
        unique = np.unique(keys)
        owners, found_values = self.read(txn, unique)
        found_keys = unique[owners]
        gone = rows_in(found_keys, found_values, keys, values)
        if not gone.any():
            return
        starts = run_starts(found_keys)
        touched = np.logical_or.reduceat(gone, starts)
        kept_counts = np.add.reduceat(~gone, starts)
        emptied = int_bytes(found_keys[starts[touched & (kept_counts == 0)]], self.key_bytes)
        for key in emptied:
            txn.delete(key, db=self.db)
        rewritten = touched & (kept_counts > 0)
        if not rewritten.any():
            return
        kept = ~gone & np.repeat(rewritten, np.diff(np.append(starts, len(found_keys))))
        packed = int_rows(found_values[kept], self.value_bytes).tobytes()
        bounds = (np.concatenate(([0], np.cumsum(kept_counts[rewritten]))) * self.value_bytes).tolist()
        key_list = int_bytes(found_keys[starts[rewritten]], self.key_bytes)
        with txn.cursor(self.db) as cursor:
            cursor.putmulti(zip(key_list, (packed[low:high] for low, high in pairwise(bounds)), strict=True))


RUNS_MERGED = 4
"""Runs that merge into one at a time, once they hold about as many rows each: a row is rewritten about
log4(table / merge) times (half as often as merging runs two by two), and a table holds up to three runs of
each size."""
_STRIDE = 64
"""Rows between two keys of a run's directory: a probe's search starts from the window of this many rows that the
directory narrows it to, seven steps of bisection."""
_HALVES = tuple(1 << step for step in reversed(range(_STRIDE.bit_length() - 1)))
_FILTER_BITS_PER_ROW = 8
_CATALOG = bytes(8)
"""The table's list of runs, oldest first, after the next run id: run 0 is no run."""
_ROWS_PART, _DIRECTORY_PART, _FILTER_PART = 0, 0xFFFFFFFE, 0xFFFFFFFF
_RUN = np.dtype([("run", "<u4"), ("stamp", "<u4"), ("rows", "<u8"), ("filter_slots", "<u8")])
"""A run's catalog record. Its ``stamp`` is drawn at random when the run is written: a write that aborts leaves
its run number free for the next one, and a run read from an aborted write must not pass for it."""
_CHUNKED_RUN = np.dtype([("run", "<u4"), ("stamp", "<u4"), ("rows", "<u8"), ("chunks", "<u4"), ("filter_slots", "<u8")])
"""A run's catalog record in an index of format 9 or older, whose runs are chunks of rows (``unchunk``)."""
_HEADER = 8
"""Bytes ahead of a run's keys: its stamp, then padding, so that every value is the end of an 8-byte word within
the run's LMDB value (read as such, then masked)."""
_DIRECTORY_KEY = np.dtype("<u8")


def _part_key(run: int, part: int) -> bytes:
    return run.to_bytes(4, "big") + part.to_bytes(4, "big")


def _padded_rows(rows: int) -> int:
    """Keys a run stores: its rows', then all-ones keys up to a whole directory window, so that a search reads
    any row of the window without a bound check."""
    return rows + (-rows) % _STRIDE


def _run_value(stamp: int, keys: np.ndarray, values: np.ndarray, key_bytes: int, value_bytes: int) -> bytes:
    """A run as its LMDB value: header, keys (padded), values, and 8 bytes that the last keys' words end in."""
    padding = b"\xff" * (key_bytes * (_padded_rows(len(keys)) - len(keys)))
    return b"".join(
        (
            stamp.to_bytes(4, "little") + bytes(_HEADER - 4),
            int_rows(keys, key_bytes).tobytes(),
            padding,
            int_rows(values, value_bytes).tobytes(),
            bytes(8),
        )
    )


class _RunView:
    """A stored run's keys and values as integers, read in place from its LMDB value (a buffer, or bytes). Each
    key is read as the big-endian word that starts with it (the key in its top bytes: a probe shifted alike is
    compared with the word as it is), each value as the word that ends with it, then masked."""

    def __init__(self, raw: Any, rows: int, key_bytes: int, value_bytes: int) -> None:
        self.rows = rows
        padded = _padded_rows(rows)
        self._words = np.ndarray((padded,), BIG_ENDIAN_U64, buffer=raw, offset=_HEADER, strides=(key_bytes,))
        self._values = np.ndarray(
            (rows,),
            BIG_ENDIAN_U64,
            buffer=raw,
            offset=_HEADER + padded * key_bytes + value_bytes - 8,
            strides=(value_bytes,),
        )
        self._shift = np.uint64(64 - 8 * key_bytes)
        self._below_key = np.uint64((1 << (64 - 8 * key_bytes)) - 1)
        self._value_mask = np.uint64((1 << (8 * value_bytes)) - 1) if value_bytes < 8 else np.uint64(2**64 - 1)

    def keys(self, at: np.ndarray | slice) -> np.ndarray:
        return self._words[at].astype(np.uint64) >> self._shift

    def values(self, at: np.ndarray | slice) -> np.ndarray:
        return self._values[at].astype(np.uint64) & self._value_mask

    def holds(self, at: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Whether the row at each position (up to the run's end) holds the key beside it."""
        return (self.keys(np.minimum(at, self.rows - 1)) == keys) & (at < self.rows)

    def first_at_or_after(self, probes: np.ndarray, directory: np.ndarray, *, after: bool) -> np.ndarray:
        """Where the rows of each probe start (or, ``after``, end): the directory's window, then bisection within
        it in fixed steps, every probe a step at a time."""
        probes = probes.astype(np.uint64, copy=False)
        window = np.searchsorted(directory, probes, side="right" if after else "left")
        # A word holds its key in its top bytes and the next keys' bytes below: a probe shifted alike (with every
        # bit below set, for ``after``) compares with the word as the keys compare.
        bound = (probes << self._shift) | self._below_key if after else probes << self._shift
        precedes: np.ufunc = np.less_equal if after else np.less
        start = np.maximum(window - 1, 0) * _STRIDE
        words = self._words
        for half in _HALVES:
            start += precedes(words[start + (half - 1)], bound) * half
        start += precedes(words[start], bound)
        return np.minimum(start, self.rows)


class SortedRuns(_Table):
    """The ``runs`` layout: immutable sorted runs of packed rows (see the module docstring)."""

    flags: ClassVar[dict[str, bool]] = {}

    def __init__(
        self, env: Any, db: Any, key_bits: int, key_bytes: int, value_bytes: int, *, rows_in_memory: bool = False
    ) -> None:
        super().__init__(env, db, key_bits, key_bytes, value_bytes)
        # Per run (number and stamp), its directory and its key bitmap, or with ``rows_in_memory`` its rows (a
        # small table that every batch probes: searched in memory, without a read per run): a run never changes,
        # so once read they hold for as long as it lives.
        self._directories: dict[tuple[int, int], np.ndarray] = {}
        self._filters: dict[tuple[int, int], np.ndarray] = {}
        self._rows: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] | None = {} if rows_in_memory else None

    def merge_due(self, txn: Any, rows: int, *, may_rewrite: bool = True) -> bool:
        """Whether a merge of this many staged rows is due at the table's turn: always, as a merge only appends,
        but for one that would merge every run into one at a turn that ``may_rewrite`` not. An index's tables
        grow alike and would rewrite themselves whole within the same round of turns: waiting for turns of their
        own spreads that work over several rounds."""
        if may_rewrite:
            return True
        runs = self._catalog(txn)[1]["rows"].tolist()
        if not runs:
            return True
        sizes = [*runs, rows]
        while _newest_merge(sizes):
            sizes[-RUNS_MERGED:] = [sum(sizes[-RUNS_MERGED:])]
        return len(sizes) > 1  # the merges stop short of the oldest run

    def row_count(self, txn: Any) -> int:
        return int(self._catalog(txn)[1]["rows"].sum())

    def read(self, txn: Any, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The stored rows of these keys (ascending, distinct), bucket after bucket: the index in ``keys`` of
        each row's key, and its value. Each run is searched for the keys its bitmap may hold, in place in LMDB's
        map (the pages a search touches are all it reads)."""
        owners, values = [], []
        runs = self._catalog(txn)[1]
        if self._rows is not None:
            for run in runs:
                run_keys, run_values = self._rows_of(txn, run, self._rows)
                at, owner = expand_ranges(
                    np.searchsorted(run_keys, keys, side="left"), np.searchsorted(run_keys, keys, side="right")
                )
                owners.append(owner)
                values.append(run_values[at])
        elif len(runs):
            with self._in_place() as mapped:
                for run in runs:
                    probed = np.flatnonzero(self._may_hold(txn, run, keys))
                    if not len(probed):
                        continue
                    view, directory, probes = self._view(mapped, txn, run), self._directory(txn, run), keys[probed]
                    low = view.first_at_or_after(probes, directory, after=False)
                    held = view.holds(low, probes)
                    probed, probes, low = probed[held], probes[held], low[held]
                    # Most keys found hold one row in a run: the next row tells, and only keys of more search on.
                    high = low + 1
                    more = np.flatnonzero(view.holds(high, probes))
                    if len(more):
                        high[more] = view.first_at_or_after(probes[more], directory, after=True)
                    at, owner = expand_ranges(low, high)
                    owners.append(probed[owner])
                    values.append(view.values(at))
        if not owners:
            return self._empty()
        owner, value = np.concatenate(owners), np.concatenate(values)
        order = np.argsort(owner, kind="stable")
        return owner[order], value[order]

    def insert(self, txn: Any, keys: np.ndarray, values: np.ndarray) -> None:
        """Store rows (keys ascending) as a new run, then merge the newest runs while ``_newest_merge`` says so."""
        if not len(keys):
            return
        next_run, stored = self._catalog(txn)
        runs = [*stored, self._write_run(txn, next_run, keys, values)]
        next_run += 1
        while _newest_merge([int(run["rows"]) for run in runs]):
            merged = runs[-RUNS_MERGED:]
            del runs[-RUNS_MERGED:]
            merged_keys, merged_values = self._run_rows(txn, merged[0])
            for newer in merged[1:]:
                merged_keys, merged_values = merged_rows(merged_keys, merged_values, *self._run_rows(txn, newer))
            for run in merged:
                self._drop_run(txn, run)
            runs.append(self._write_run(txn, next_run, merged_keys, merged_values))
            next_run += 1
        self._put_catalog(txn, next_run, runs)

    def delete(self, txn: Any, keys: np.ndarray, values: np.ndarray) -> None:
        """Remove every copy of these rows: the table is written again without them."""
        stored_keys, stored_values = self.rows(txn)
        kept = ~rows_in(stored_keys, stored_values, keys, values)
        if not kept.all():
            self.replace(txn, stored_keys[kept], stored_values[kept])

    def key_chunks(self, txn: Any, size: int) -> Iterator[np.ndarray]:
        """Every stored row's key, run after run, up to ``size`` at a time, read in place in LMDB's map."""
        runs = self._catalog(txn)[1]
        if not len(runs):
            return
        with self._in_place() as mapped:
            for run in runs:
                view = self._view(mapped, txn, run)
                for start in range(0, view.rows, size):
                    yield view.keys(slice(start, min(start + size, view.rows)))

    def rows(self, txn: Any) -> tuple[np.ndarray, np.ndarray]:
        """Every stored row in key order (a key's rows run after run, oldest first): keys, values."""
        keys, values = self._empty()
        keys = keys.astype(np.uint64)
        for run in self._catalog(txn)[1]:
            keys, values = merged_rows(keys, values, *self._run_rows(txn, run))
        return keys, values

    def replace(self, txn: Any, keys: np.ndarray, values: np.ndarray) -> None:
        """Store exactly these rows (sorted by key), in place of all stored: one run."""
        next_run, stored = self._catalog(txn)
        for run in stored:
            self._drop_run(txn, run)
        runs = [self._write_run(txn, next_run, keys, values)] if len(keys) else []
        self._put_catalog(txn, next_run + 1, runs)

    def unchunk(self, txn: Any) -> None:
        """Store the runs of an index of format 9 or older, each a series of chunks of packed rows, as one run of
        this format."""
        raw = txn.get(_CATALOG, db=self.db)
        if raw is None:
            return
        next_run = int.from_bytes(raw[:4], "little")
        keys, values = self._empty()
        keys = keys.astype(np.uint64)
        for run in np.frombuffer(raw[4:], dtype=_CHUNKED_RUN):
            chunks, end = [], _part_key(int(run["run"]), _DIRECTORY_PART)
            with txn.cursor(self.db) as cursor:
                # A run's chunks are the keys from its number up to its directory (which always follows them).
                found = cursor.set_range(_part_key(int(run["run"]), _ROWS_PART))
                for key, chunk in cursor.iternext() if found else ():
                    if key >= end:
                        break
                    chunks.append(chunk)
            keys, values = merged_rows(keys, values, *self.split_rows(b"".join(chunks)))
            self._drop_run(txn, run)
        runs = [self._write_run(txn, next_run, keys, values)] if len(keys) else []
        self._put_catalog(txn, next_run + 1, runs)

    def _catalog(self, txn: Any) -> tuple[int, np.ndarray]:
        """The next run id, and the runs oldest first."""
        raw = txn.get(_CATALOG, db=self.db)
        if raw is None:
            return 1, np.zeros(0, dtype=_RUN)
        return int.from_bytes(raw[:4], "little"), np.frombuffer(raw[4:], dtype=_RUN)

    def _put_catalog(self, txn: Any, next_run: int, runs: Sequence[np.void]) -> None:
        packed = np.array(runs, dtype=_RUN) if runs else np.zeros(0, dtype=_RUN)
        txn.put(_CATALOG, next_run.to_bytes(4, "little") + packed.tobytes(), db=self.db)
        live = set(zip(packed["run"].tolist(), packed["stamp"].tolist(), strict=True))
        for cache in (self._directories, self._filters, self._rows or {}):
            for run in [run for run in cache if run not in live]:
                del cache[run]

    def _write_run(self, txn: Any, run: int, keys: np.ndarray, values: np.ndarray) -> np.void:
        """Append a run of these rows (keys ascending); its catalog record."""
        stamp = int.from_bytes(os.urandom(4), "little")
        directory = keys[::_STRIDE].astype(_DIRECTORY_KEY)
        filter_slots = len(keys) * _FILTER_BITS_PER_ROW
        present = np.zeros(filter_slots, dtype=bool)
        present[_filter_slots(keys, filter_slots)] = True
        bitmap = np.packbits(present, bitorder="little")
        parts = [
            (_part_key(run, _ROWS_PART), _run_value(stamp, keys, values, self.key_bytes, self.value_bytes)),
            (_part_key(run, _DIRECTORY_PART), directory.tobytes()),
            (_part_key(run, _FILTER_PART), bitmap.tobytes()),
        ]
        with txn.cursor(self.db) as cursor:
            _, added = cursor.putmulti(parts, append=True)
        if added != len(parts):
            raise ValueError(f"run {run} is not the table's newest")
        self._directories[run, stamp], self._filters[run, stamp] = directory, bitmap
        if self._rows is not None:
            self._rows[run, stamp] = keys.astype(np.uint64), values.astype(np.uint64)
        return np.array([(run, stamp, len(keys), filter_slots)], dtype=_RUN)[0]

    def _drop_run(self, txn: Any, run: np.void) -> None:
        """Delete the run's rows, directory and bitmap: every key that starts with its number, in one pass of a
        cursor, which steps to the next key as it deletes."""
        prefix = int(run["run"]).to_bytes(4, "big")
        with txn.cursor(self.db) as cursor:
            if cursor.set_range(prefix):
                while cursor.key()[:4] == prefix:
                    cursor.delete()

    def _run_rows(self, txn: Any, run: np.void) -> tuple[np.ndarray, np.ndarray]:
        view = self._run_view(txn.get(_part_key(int(run["run"]), _ROWS_PART), db=self.db), run)
        return view.keys(slice(view.rows)), view.values(slice(None))

    def _run_view(self, raw: Any, run: np.void) -> _RunView:
        return _RunView(raw, int(run["rows"]), self.key_bytes, self.value_bytes)

    @contextmanager
    def _in_place(self) -> Iterator[Any]:
        """A read transaction whose values are buffers into LMDB's map (valid until it ends): runs are searched
        where they lie, not copied."""
        mapped = begin_read(self.env, buffers=True)
        try:
            yield mapped
        finally:
            mapped.abort()

    def _view(self, mapped: Any, txn: Any, run: np.void) -> _RunView:
        """The run as ``txn`` holds it, in place where the mapped snapshot holds the same run (its stamp tells),
        else (a run that ``txn`` wrote, or that a later commit dropped) copied through ``txn``."""
        key = _part_key(int(run["run"]), _ROWS_PART)
        raw = mapped.get(key, db=self.db)
        if raw is None or int.from_bytes(raw[:4], "little") != int(run["stamp"]):
            raw = txn.get(key, db=self.db)
        return self._run_view(raw, run)

    def _rows_of(
        self, txn: Any, run: np.void, cache: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]
    ) -> tuple[np.ndarray, np.ndarray]:
        named = (int(run["run"]), int(run["stamp"]))
        if named not in cache:
            cache[named] = self._run_rows(txn, run)
        return cache[named]

    def _directory(self, txn: Any, run: np.void) -> np.ndarray:
        named = (int(run["run"]), int(run["stamp"]))
        if named not in self._directories:
            raw = txn.get(_part_key(named[0], _DIRECTORY_PART), db=self.db)
            self._directories[named] = np.frombuffer(raw, dtype=_DIRECTORY_KEY)
        return self._directories[named]

    def _may_hold(self, txn: Any, run: np.void, keys: np.ndarray) -> np.ndarray:
        named = (int(run["run"]), int(run["stamp"]))
        if named not in self._filters:
            self._filters[named] = np.frombuffer(txn.get(_part_key(named[0], _FILTER_PART), db=self.db), np.uint8)
        slots = _filter_slots(keys, int(run["filter_slots"]))
        return ((self._filters[named][slots >> 3] >> (slots & 7).astype(np.uint8)) & 1).astype(bool)


def _newest_merge(rows: list[int]) -> bool:
    """Whether the newest ``RUNS_MERGED`` runs (``rows`` of each run, oldest first) merge into one: once the
    oldest of them holds no more rows than the others together."""
    newest = rows[-RUNS_MERGED:]
    return len(newest) == RUNS_MERGED and newest[0] <= sum(newest[1:])


def _filter_slots(keys: np.ndarray, slots: int) -> np.ndarray:
    """Each key's slot of a run's bitmap of ``slots`` bits (at most 2**32: runs of up to 2**29 rows): the top 32
    bits of a mixed key scaled to the range."""
    mixed = (np.asarray(keys, dtype=np.uint64) * _GOLDEN) >> np.uint64(32)
    return ((mixed * np.uint64(slots)) >> np.uint64(32)).astype(np.intp)


def table_class(layout: TableLayout) -> type[DuplicateRows] | type[PackedBuckets] | type[SortedRuns]:
    if layout == "buckets":
        return PackedBuckets
    return SortedRuns if layout == "runs" else DuplicateRows
