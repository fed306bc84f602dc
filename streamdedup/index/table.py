"""One index table: (key, value) rows of unsigned integers, each a fixed number of big-endian bytes, in one LMDB
database, laid out one of two ways (the index stores which):

- ``rows`` (:class:`DuplicateRows`): ``dupsort`` + ``dupfixed``, one LMDB row per table row, each bucket read as
  one packed array by ``getmulti``. A key with one row is a plain node, so this suits tables whose keys hold
  about one row each (the segmented default's entry-valued tables), and every index written before format 4.
- ``buckets`` (:class:`PackedBuckets`): one LMDB row per key, its value the key's table values packed end to
  end. A dupsort key of many rows pays a 16-byte sub-page header and up to four rows of slack on top of its
  node, and sub-pages growing in place split leaf pages half empty: under the 1M-entry 64-bit plan (four
  tables of 16-bit keys, ~15 rows a key) merged tables took 12.1-13.4 bytes a row as ``rows`` and take
  7.0-7.3 as buckets. A merge that reaches most buckets rewrites the table in key order with LMDB's append
  mode, which fills every page; a smaller one reads and writes back the buckets it extends. Fold-valued
  tables use it: their plan cuts keys so that each holds about eight rows or more.

A row added twice is stored once in ``rows`` and twice in ``buckets`` (a merge appends without reading the
bucket's values): lookups count a pair once however often it is found, and :meth:`delete` removes every copy.
"""

from __future__ import annotations

from itertools import pairwise, starmap
from typing import Any, ClassVar, Literal

import numpy as np

__all__ = [
    "BIG_ENDIAN_U64",
    "DuplicateRows",
    "PackedBuckets",
    "TableLayout",
    "bytes_int",
    "int_bytes",
    "int_rows",
    "rows_in",
    "table_class",
]

TableLayout = Literal["rows", "buckets"]
BIG_ENDIAN_U64 = np.dtype(">u8")
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


def _run_starts(sorted_values: np.ndarray) -> np.ndarray:
    """Index of the first of each run of equal values (``sorted_values`` grouped, e.g. ascending)."""
    return np.flatnonzero(np.concatenate(([True], sorted_values[1:] != sorted_values[:-1])))


def _bucket_owners(found_keys: np.ndarray, probed: np.ndarray) -> np.ndarray:
    """Index in ``probed`` (ascending, distinct) of each found row's key, the rows coming as getmulti returns
    them: each probed key's bucket whole, in key order. One search per bucket, not per row."""
    if not len(found_keys):
        return np.zeros(0, dtype=np.intp)
    starts = _run_starts(found_keys)
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
    mixed = keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ values.astype(np.uint64)
    mixed ^= mixed >> np.uint64(33)
    mixed *= np.uint64(0xFF51AFD7ED558CCD)
    mixed ^= mixed >> np.uint64(33)
    return mixed


class _Table:
    def __init__(self, db: Any, key_bits: int, key_bytes: int, value_bytes: int) -> None:
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
        rows = np.frombuffer(raw, dtype=np.uint8).reshape(-1, kb + vb)
        return bytes_int(rows[:, :kb]), bytes_int(rows[:, kb:])

    def join_rows(self, keys: np.ndarray, values: np.ndarray) -> bytes:
        """The inverse of :meth:`split_rows`."""
        return np.hstack([int_rows(keys, self.key_bytes), int_rows(values, self.value_bytes)]).tobytes()

    def _empty(self) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(0, np.intp), np.zeros(0, np.uint64)


class DuplicateRows(_Table):
    """The ``rows`` layout: a dupsort + dupfixed database."""

    flags: ClassVar[dict[str, bool]] = {"dupsort": True, "dupfixed": True}

    def merge_due(self, txn: Any, rows: int) -> bool:
        """Whether a merge of this many staged rows is due at the table's turn: always, as a row costs the same
        in any merge."""
        return True

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

    def merge_due(self, txn: Any, rows: int) -> bool:
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
        starts = _run_starts(keys)
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
        starts = _run_starts(found_keys)
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


def table_class(layout: TableLayout) -> type[DuplicateRows] | type[PackedBuckets]:
    return PackedBuckets if layout == "buckets" else DuplicateRows
