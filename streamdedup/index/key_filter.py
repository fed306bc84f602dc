"""A presence filter over the tables' keys: a lookup asks LMDB only for keys that may be stored.

Most documents of a stream are novel, and each of their keys misses in every table; a miss still costs a B-tree
descent through py-lmdb (~0.5 us a key on a 35k-entry table, 32 keys a document under the default plan). One
bitmap per table answers first, with one numpy gather for the whole batch. A key's bit is set when a row with
that key is added and never cleared, so a clear bit proves the key absent, and a set bit may be stale (a removed
row) or shared (another key hashed to it): then LMDB is asked as before. The filter can skip a miss, never hide
a match.

Outgrown by its index, it doubles in place of a rebuild from every stored entry: a key's slot is the top bits of
a hash, so the bit of slot s becomes the bits of both slots it splits into (2s and 2s + 1). Keys added before
a doubling then hold two bits each; after k doublings about k/2 bits a key are set instead of one (under 8 %
of absent keys pass after the five doublings from the smallest bitmaps to the largest, against 6 % when
rebuilt), and no stored entry is read again. A writer prepares the doubling ahead (:meth:`KeyFilter.prepare`):
from half its capacity on, each batch that adds keys splits into the larger bitmaps the share of them that its
entries are of the way to ``_READY_AT`` of the capacity, and keys added meanwhile go into both (into the larger
ones where they are split already), so that the batch that outgrows the bitmaps finds the larger ones ready
rather than pausing to split them all (tens of milliseconds at the largest, and on some hosts several times that
to touch their fresh memory), each batch doing its share.

One more bitmap does the same for the ids of stored entries (over a hash of each id's key, see
``store.id_hashes``): most documents of a stream bring an id never seen, and a clear bit spares the read of the
id runs that looks for it as a redelivery or a re-added id. That read costs about the same for one id as for a
batch's worth (a search of every run), so the ids' bitmap is made to let almost none through: 128 bits an entry,
three of them set by an id, and an id passes only when all three are; at capacity about 1 new id in 80,000
passes (1.5 % at 16 bits and two set), so most batches of a thousand new ids read no id run at all.

It is valid for one state of the index, named by the index's count of batches that added keys (``covers``):
the index checks that count before trusting the filter, and rebuilds the filter from the stored entries when
another writer (another process) moved it. A closing writer saves it beside the index with a random token that
it also stores in the index; every later batch that adds keys deletes the token, so a saved filter is loaded
only into the very state it was saved from.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["KeyFilter"]

BITS_PER_KEY = 16
"""At capacity, about 6 % of absent keys find their bit set (1 - e^(-1/16))."""
MIN_CAPACITY = 1 << 16
MAX_BYTES = 128 << 20
"""All tables together (the ids' bitmap apart, see ``MAX_ID_BYTES``): past ~2M entries under 32 tables the filter
lets more misses through, not more memory."""
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the product's top bits mix every key bit
# An id's bits: the top bits of its hash times each of these odd multipliers.
_ID_MULTIPLIERS = np.array([_GOLDEN, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9], dtype=np.uint64)
_ID_BITS = len(_ID_MULTIPLIERS)  # saved with the bitmaps: a filter saved with another count is rebuilt
BITS_PER_ID = 128
"""At capacity, about (1 - e^(-3/128))^3 = 1 in 80,000 new ids find all three of their bits set."""
MAX_ID_BYTES = 32 << 20
# Keys per table added at once: with many more, the passes' scattered reads and writes fall out of cache (65,536
# a table in one go took longer than np.bitwise_or.at; in blocks of this size, 10-20 % less).
_ADD_BLOCK = 8192
# A doubling is prepared from this share of the capacity on and is ready at the second: a batch splits the bytes
# of the bitmaps (all tables' end to end, and the ids') in proportion to the entries it brings over that span. What
# a batch splits is contiguous, and so the first touch of only its own share of the larger bitmaps' memory (numpy
# asks for huge pages, which some hosts are slow to provide). A batch that outgrows the bitmaps before they are
# ready (more entries than the rest of the span) has the rest split by the doubling itself.
_PREPARE_FROM = 0.5
_READY_AT = 0.875


def _spread(nibble_shift: int) -> np.ndarray:
    """Per byte: its four bits from ``nibble_shift`` on, each doubled (bit i to bits 2i and 2i + 1)."""
    values = np.arange(256, dtype=np.uint16) >> nibble_shift
    spread = np.zeros(256, dtype=np.uint16)
    for bit in range(4):
        spread |= ((values >> bit) & 1) * (3 << (2 * bit))
    return spread.astype(np.uint8)


# A byte's slots 8i..8i+7 split into slots 16i..16i+15: the low four bits fill the first new byte, the high four
# the second. Bitmaps are read two bytes at a time, each little-endian 16-bit word gathering the 32-bit word it
# becomes from a table of all 65,536 (256 KiB, which stays in cache): half the gathers of a table of bytes, into a
# contiguous output (a gather for each half written with strides costs four times as long): about 0.1 s for the
# largest bitmaps in all, which a prepared doubling spreads over its slices.
_BYTE_SPREAD = _spread(0).astype("<u4") | (_spread(4).astype("<u4") << 8)  # per byte, its bits doubled
_WORDS = np.arange(1 << 16)
_SPREAD = (_BYTE_SPREAD[_WORDS & 0xFF] | (_BYTE_SPREAD[_WORDS >> 8] << 16)).astype("<u4")


def _split_slots(bitmaps: np.ndarray) -> np.ndarray:
    """Bitmaps of twice the slots, each slot's bit in both slots it splits into (rows of an even number of bytes:
    every bitmap that splits holds at least 2**17)."""
    split = np.empty((*bitmaps.shape[:-1], bitmaps.shape[-1] // 2), dtype=_SPREAD.dtype)
    np.take(_SPREAD, bitmaps.view("<u2"), out=split, mode="clip")  # words index all 65,536 entries: no bounds
    return split.view(np.uint8)


def _set_bits(bitmaps: np.ndarray, slots: np.ndarray, limit: int) -> None:
    """Set the bits of ``slots`` ((rows, m)) in ``bitmaps`` ((rows, bytes)), row for row, those within the first
    ``limit`` bytes of the rows end to end."""
    row_bytes = np.uint64(bitmaps.shape[1])
    positions = (np.arange(len(slots), dtype=np.uint64)[:, None] * row_bytes + (slots >> np.uint64(3))).ravel()
    positions = positions.astype(np.intp)
    bits = (slots & np.uint64(7)).astype(np.uint8).ravel()
    if limit < bitmaps.size:
        within = positions < limit
        positions, bits = positions[within], bits[within]
    # One pass per bit position, where np.bitwise_or.at takes one pass but 3-6x as long on a batch's keys: within
    # a pass every write ORs the same bit, so keys that share a byte cannot undo each other's.
    order = np.argsort(bits, kind="stable")
    bounds = np.searchsorted(bits[order], np.arange(9, dtype=np.uint8)).tolist()
    flat = bitmaps.reshape(-1)
    for bit in range(8):
        flat[positions[order[bounds[bit] : bounds[bit + 1]]]] |= np.uint8(1 << bit)


def _bits_at(bitmaps: np.ndarray, row: int | np.ndarray, slots: np.ndarray) -> np.ndarray:
    """The bits of ``slots`` in ``bitmaps`` row ``row`` (or ``row[i]`` each)."""
    # One gather from the flat bitmaps: cheaper than indexing rows and columns.
    at = (slots >> np.uint64(3)).astype(np.intp)
    at += np.asarray(row, dtype=np.intp) * bitmaps.shape[1]
    found = bitmaps.reshape(-1)[at]
    found >>= (slots & np.uint64(7)).astype(np.uint8)
    return (found & np.uint8(1)).view(bool)


class KeyFilter:
    """One bitmap per table over hashed keys (the keys themselves when the bitmap has room for all), and one over
    hashed ids, as large as a table's would be if its keys were hashed."""

    def __init__(self, key_bits: Sequence[int], capacity: int, covers: int) -> None:
        tables = len(key_bits)
        self._key_bits = tuple(key_bits)
        wanted = max(3, (max(capacity, MIN_CAPACITY) * BITS_PER_KEY - 1).bit_length())
        # What was asked, rounded up to the minimum and to a power of two (so a small index does not rebuild the
        # filter at every doubling): the entries the bitmaps serve, unless capped below it.
        self.capacity = (1 << wanted) // BITS_PER_KEY
        largest_hashed = max(3, (MAX_BYTES * 8 // tables).bit_length() - 1)
        self._largest = min(max(key_bits), largest_hashed)
        self.slot_bits = min(self._largest, wanted)
        self.id_slot_bits = min((MAX_ID_BYTES * 8).bit_length() - 1, (self.capacity * BITS_PER_ID - 1).bit_length())
        self.covers = covers
        self._identity = self.slot_bits >= max(key_bits)
        self._shift = np.uint64(64 - self.slot_bits)
        self._bitmaps = np.zeros((tables, (1 << self.slot_bits) // 8), dtype=np.uint8)
        self._id_bitmap = np.zeros((1, (1 << self.id_slot_bits) // 8), dtype=np.uint8)
        # The doubling being prepared (:meth:`prepare`), and how much of the bitmaps is split into it: bytes of the
        # tables' bitmaps (end to end) and of the ids'.
        self._larger: KeyFilter | None = None
        self._split_bytes = (0, 0)

    def useful(self, entries: int) -> bool:
        """Whether ``entries`` keys a table leave most of its bits clear (else nearly every key passes and
        keeping the filter costs more than it saves)."""
        return entries <= (1 << self.slot_bits) * math.log(2)

    def outgrown(self, entries: int) -> bool:
        """True when ``entries`` overfill the bitmaps and larger ones are allowed."""
        return entries > self.capacity and self.slot_bits < self._largest

    def doubled(self) -> KeyFilter | None:
        """The same filter with bitmaps twice as large (twice the capacity), every key added so far still
        present; None when larger bitmaps are not allowed or would hold the keys themselves (no hash bits to
        split): then only a rebuild from the stored entries serves. What :meth:`prepare` has not split yet is
        split now."""
        if not self._splits():
            return None
        larger = self._larger_filter()
        self._split_into(larger, 1.0)
        self._larger, self._split_bytes = None, (0, 0)
        larger.covers = self.covers
        return larger

    def prepare(self, entries: int) -> None:
        """With ``entries`` past half the capacity, split the bitmaps into those of the next doubling up to the
        share that ``entries`` are of the way to ``_READY_AT`` of it (a writer calls this once a batch that adds
        keys)."""
        start = _PREPARE_FROM * self.capacity
        if entries < start or not self._splits():
            return
        self._split_into(
            self._larger_filter(), min(1.0, (entries - start) / ((_READY_AT - _PREPARE_FROM) * self.capacity))
        )

    def _splits(self) -> bool:
        """Whether a doubling splits hashed slots (larger bitmaps allowed, and still hashed)."""
        return not self._identity and self.slot_bits < self._largest and self.slot_bits + 1 < max(self._key_bits)

    def _larger_filter(self) -> KeyFilter:
        """The doubling being prepared, started now if none is."""
        if self._larger is None:
            self._larger, self._split_bytes = KeyFilter(self._key_bits, 2 * self.capacity, self.covers), (0, 0)
        return self._larger

    def _split_into(self, larger: KeyFilter, share: float) -> None:
        """Split the bitmaps into ``larger``'s (which holds nothing there yet) up to ``share`` of their bytes."""
        tables, ids = self._bitmaps.reshape(-1), self._id_bitmap.reshape(-1)
        # Whole 16-bit words: what _split_slots reads.
        table_end, id_end = (
            max(done, 2 * math.ceil(share * len(bitmap) / 2))
            for done, bitmap in zip(self._split_bytes, (tables, ids), strict=True)
        )
        table_start, id_start = self._split_bytes
        if (table_start, id_start) == (table_end, id_end):
            return
        # A byte of slots 8i..8i+7 splits into the two bytes of slots 16i..16i+15: bytes a..b of the tables' bitmaps
        # end to end become bytes 2a..2b of the larger ones'.
        larger._bitmaps.reshape(-1)[2 * table_start : 2 * table_end] = _split_slots(tables[table_start:table_end])
        if larger.id_slot_bits == self.id_slot_bits:
            # At MAX_ID_BYTES already, the ids keep their slots.
            larger._id_bitmap.reshape(-1)[id_start:id_end] = ids[id_start:id_end]
        else:
            larger._id_bitmap.reshape(-1)[2 * id_start : 2 * id_end] = _split_slots(ids[id_start:id_end])
        self._split_bytes = (table_end, id_end)

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.uint64)
        return keys if self._identity else (keys * _GOLDEN) >> self._shift

    def _id_slots(self, id_hashes: np.ndarray) -> np.ndarray:
        """(_ID_BITS, n): each id's slots, one from each multiplier of its hash."""
        hashes = np.asarray(id_hashes, dtype=np.uint64)
        return (_ID_MULTIPLIERS[:, None] * hashes) >> np.uint64(64 - self.id_slot_bits)

    def add(self, keys: np.ndarray, id_hashes: np.ndarray) -> None:
        """Mark ``keys`` ((tables, n) uint64, row t holding table t's keys) and ids (their ``id_hashes``, see
        ``store.id_hashes``) as present."""
        keys = np.asarray(keys, dtype=np.uint64)
        self._add(keys, id_hashes, self._bitmaps.size, self._id_bitmap.size)
        larger = self._larger
        if larger is not None:
            # Only into the bytes split already: the others get these bits when they are split, and setting
            # them now would touch all of the larger bitmaps' memory at once.
            table_bytes, id_bytes = self._split_bytes
            same_ids = larger.id_slot_bits == self.id_slot_bits
            larger._add(keys, id_hashes, 2 * table_bytes, id_bytes if same_ids else 2 * id_bytes)

    def add_table(self, table: int, keys: np.ndarray) -> None:
        """Mark ``keys`` of one table as present, in a filter being filled (no doubling is prepared yet)."""
        row = self._bitmaps[table : table + 1]
        keys = np.asarray(keys, dtype=np.uint64).reshape(1, -1)
        for start in range(0, keys.shape[1], _ADD_BLOCK):
            _set_bits(row, self._slots(keys[:, start : start + _ADD_BLOCK]), row.size)

    def _add(self, keys: np.ndarray, id_hashes: np.ndarray, table_bytes: int, id_bytes: int) -> None:
        """Set the bits of the keys that fall within the first ``table_bytes`` bytes of the tables' bitmaps (end
        to end), and those of the ids within the first ``id_bytes`` bytes of the ids' bitmap."""
        for start in range(0, keys.shape[1], _ADD_BLOCK):
            _set_bits(self._bitmaps, self._slots(keys[:, start : start + _ADD_BLOCK]), table_bytes)
        id_slots = self._id_slots(id_hashes).reshape(1, -1)
        for start in range(0, id_slots.shape[1], _ADD_BLOCK):
            _set_bits(self._id_bitmap, id_slots[:, start : start + _ADD_BLOCK], id_bytes)

    def may_contain(self, table: int | np.ndarray, keys: np.ndarray) -> np.ndarray:
        """False where ``keys`` are certainly absent from ``table`` (or from ``table[i]`` each, given an array)."""
        return _bits_at(self._bitmaps, table, self._slots(keys))

    def may_hold_ids(self, id_hashes: np.ndarray) -> np.ndarray:
        """False where the ids of these ``id_hashes`` are certainly not stored."""
        return np.logical_and.reduce(_bits_at(self._id_bitmap, 0, self._id_slots(id_hashes)), axis=0)

    def save(self, path: Path, token: bytes) -> None:
        """Write the bitmaps and ``token`` to ``path`` (complete or not at all)."""
        partial = path.with_name(path.name + ".partial")
        with partial.open("wb") as out:
            np.savez(
                out,
                token=np.frombuffer(token, dtype=np.uint8),
                bitmaps=self._bitmaps,
                ids=self._id_bitmap,
                id_bits=np.array(_ID_BITS),
                capacity=np.array(self.capacity),
            )
        os.replace(partial, path)

    @classmethod
    def load(cls, path: Path, token: bytes, key_bits: Sequence[int], covers: int) -> KeyFilter | None:
        """The filter saved at ``path`` with ``token`` for these tables, else None."""
        try:
            with np.load(path) as saved:
                if saved["token"].tobytes() != token or "id_bits" not in saved or saved["id_bits"] != _ID_BITS:
                    return None
                bitmaps, id_bitmap = saved["bitmaps"], saved["ids"]
                key_filter = cls(key_bits, int(saved["capacity"]), covers)
                if bitmaps.shape != key_filter._bitmaps.shape or id_bitmap.shape != key_filter._id_bitmap.shape:
                    return None
                key_filter._bitmaps, key_filter._id_bitmap = bitmaps, id_bitmap
                return key_filter
        except (OSError, ValueError, KeyError):
            return None
