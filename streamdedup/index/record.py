"""An entry's record as LMDB stores it, and the head it reads as: fingerprint, event time, origin, payload.

A record is its head's bytes and then the entry's id. Heads are read and written as numpy arrays of
:meth:`IndexFormat.record <streamdedup.index.format.IndexFormat.record>`, whatever the layout on disk:

- ``fixed`` (indexes made before format 7): the head as it is in memory, every field at its full width.
- ``packed``: the event time, a bit per 32-bit lane of the fingerprint that is not zero (most lanes of a short
  text's fingerprint are), a flag for an origin, then the origin if there is one, the non-zero lanes, and the
  payload. A payload of bottom-k sketch values (``SKETCH_PAYLOAD``) keeps only the sketch's real values, each in
  3 bytes: the :data:`~streamdedup.minhash.SIGNIFICANT_BITS` bits comparisons read (see ``minhash``). Other
  payloads are stored as given.

Both layouts are encoded and decoded over whole batches: numpy gathers and scatters bytes at computed offsets,
and Python touches each record only to hand LMDB its bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..minhash import EMPTY_SLOT, SKETCH_BITS, insignificant_bits
from .packed_ids import PackedIds

__all__ = [
    "BYTES_PAYLOAD",
    "FIXED_RECORDS",
    "NO_TOPIC",
    "ORIGIN",
    "PACKED_RECORDS",
    "PAYLOAD_KINDS",
    "SKETCH_PAYLOAD",
    "RecordLayout",
    "origins_of",
]

NO_TOPIC = 0xFFFFFFFF
"""The topic of an entry without an origin (stored by the offline mode)."""
FIXED_RECORDS, PACKED_RECORDS = "fixed", "packed"
BYTES_PAYLOAD, SKETCH_PAYLOAD = "bytes", "bottom-k"
PAYLOAD_KINDS = (BYTES_PAYLOAD, SKETCH_PAYLOAD)
_LANE = np.dtype("<u4")
ORIGIN = np.dtype([("topic", "<u4"), ("partition", "<i4"), ("offset", "<i8")])
"""An entry's origin: topic id (:data:`NO_TOPIC` for none), partition, offset."""
_HAS_ORIGIN = np.uint8(1)
_SKETCH_VALUE_BYTES = 3


class RecordLayout:
    """Encodes heads (and ids) into records and decodes records into heads (and ids), for one index format."""

    def __init__(self, head: np.dtype, layout: str, payload: str) -> None:
        if layout not in (FIXED_RECORDS, PACKED_RECORDS):
            raise ValueError(f"unknown record layout {layout!r}")
        if payload not in PAYLOAD_KINDS:
            raise ValueError(f"unknown payload kind {payload!r}")
        self.head = head
        self.layout = layout
        self.payload = payload
        self.payload_bytes = int(np.prod(head["payload"].shape))
        if payload == SKETCH_PAYLOAD and self.payload_bytes % _LANE.itemsize:
            raise ValueError(f"a sketch payload is whole uint32 values, not {self.payload_bytes} bytes")
        self.lanes = head["fp"].shape[0] * 2
        prefix = [("time", "<f8"), ("lanes", "u1", (math.ceil(self.lanes / 8),)), ("flags", "u1")]
        if payload == SKETCH_PAYLOAD:
            prefix += [("values", "<u2"), ("cleared", "u1")]
        self._prefix = np.dtype(prefix)

    def encode(self, heads: np.ndarray, id_bytes: Sequence[bytes]) -> list[bytes]:
        """Each entry's record: its head and then its id (UTF-8)."""
        if self.layout == FIXED_RECORDS:
            return list(map(bytes.__add__, heads.view(f"V{self.head.itemsize}").tolist(), id_bytes))
        n = len(heads)
        prefix = np.zeros(n, dtype=self._prefix)
        prefix["time"] = heads["time"]
        lanes = np.ascontiguousarray(heads["fp"]).view(_LANE).reshape(n, self.lanes)
        nonzero = lanes != 0
        lane_counts = nonzero.sum(axis=1)
        prefix["lanes"] = np.packbits(nonzero, axis=1, bitorder="little")
        has_origin = heads["topic"] != NO_TOPIC
        prefix["flags"] = has_origin * _HAS_ORIGIN
        payloads, payload_lengths = self._stored_payloads(heads, prefix)
        # Every part of every record in a row of its own, left-aligned, and which of its bytes are stored.
        compact = np.zeros((n, self.lanes), dtype=_LANE)
        compact[_leading(lane_counts, self.lanes)] = lanes[nonzero]
        rows = np.concatenate(
            [
                prefix.view(np.uint8).reshape(n, self._prefix.itemsize),
                origins_of(heads).view(np.uint8).reshape(n, ORIGIN.itemsize),
                compact.view(np.uint8),
                payloads,
            ],
            axis=1,
        )
        stored = np.concatenate(
            [
                np.ones((n, self._prefix.itemsize), dtype=bool),
                np.repeat(has_origin[:, None], ORIGIN.itemsize, axis=1),
                _leading(lane_counts * _LANE.itemsize, compact.itemsize * self.lanes),
                _leading(payload_lengths, payloads.shape[1]),
            ],
            axis=1,
        )
        buffer = rows[stored].tobytes()
        lengths = self._prefix.itemsize + has_origin * ORIGIN.itemsize + lane_counts * _LANE.itemsize + payload_lengths
        stops = np.cumsum(lengths)
        heads_bytes = map(buffer.__getitem__, map(slice, (stops - lengths).tolist(), stops.tolist()))
        return list(map(bytes.__add__, heads_bytes, id_bytes))

    def decode(self, records: Sequence[bytes], *, payloads: bool = True) -> tuple[np.ndarray, PackedIds]:
        """The heads and ids of these records, in their order; ``payloads=False`` leaves packed payloads zero
        (unread)."""
        n = len(records)
        buffer = b"".join(records)
        lengths = np.fromiter(map(len, records), dtype=np.int64, count=n)
        stops = np.cumsum(lengths)
        starts = stops - lengths
        if self.layout == FIXED_RECORDS:
            size = self.head.itemsize
            heads = np.frombuffer(b"".join(record[:size] for record in records), dtype=self.head)
            return heads, PackedIds(buffer, starts + size, stops)
        # Zeros after the last record: a part read at full width past its end reads them.
        flat = np.frombuffer(buffer + bytes(self._widest), dtype=np.uint8)
        heads = np.zeros(n, dtype=self.head)
        prefix = _rows_at(flat, starts, self._prefix.itemsize).view(self._prefix).ravel()
        heads["time"] = prefix["time"]
        at = starts + self._prefix.itemsize
        has_origin = (prefix["flags"] & _HAS_ORIGIN).astype(bool)
        origins = _rows_at(flat, at[has_origin], ORIGIN.itemsize).view(ORIGIN).ravel()
        heads["topic"] = NO_TOPIC
        for name in ORIGIN.names or ():
            heads[name][has_origin] = origins[name]
        at += has_origin * ORIGIN.itemsize
        nonzero = np.unpackbits(prefix["lanes"], axis=1, count=self.lanes, bitorder="little").astype(bool)
        lane_counts = nonzero.sum(axis=1)
        compact = _rows_at(flat, at, self.lanes * _LANE.itemsize).view(_LANE)
        lanes = np.zeros((n, self.lanes), dtype=_LANE)
        lanes[nonzero] = compact[_leading(lane_counts, self.lanes)]
        heads["fp"] = lanes.view("<u8")
        at += lane_counts * _LANE.itemsize
        if payloads:
            heads["payload"] = self._read_payloads(flat, at, prefix)
        return heads, PackedIds(buffer, at + self._payload_lengths(prefix), stops)

    @cached_property
    def _sketch_slots(self) -> int:
        return self.payload_bytes // _LANE.itemsize

    @cached_property
    def _sketch_slots_stored(self) -> int:
        """Slots a sketch is packed in: whole groups of 4 values (12 bytes, 3 uint32 words)."""
        return -(-self._sketch_slots // 4) * 4

    @cached_property
    def _widest(self) -> int:
        """The most bytes a part of a record is read at."""
        payload = self._sketch_slots_stored * _SKETCH_VALUE_BYTES if self.payload == SKETCH_PAYLOAD else 0
        return max(self._prefix.itemsize, ORIGIN.itemsize, self.lanes * _LANE.itemsize, self.payload_bytes, payload)

    def _stored_payloads(self, heads: np.ndarray, prefix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each payload's bytes as stored, left-aligned in its row, and how many it takes; sets their prefix
        fields."""
        n = len(heads)
        payloads = np.ascontiguousarray(heads["payload"]).reshape(n, self.payload_bytes)
        if self.payload == BYTES_PAYLOAD:
            return payloads, np.full(n, self.payload_bytes)
        sketches = payloads.view(_LANE)
        # Ascending, pads last, values below the pads' top bit: a sketch.
        if (sketches[:, 1:] < sketches[:, :-1]).any() or (sketches.view(np.int32) < -1).any():
            raise ValueError(f"sketch payloads hold {SKETCH_BITS}-bit values, ascending, and then pads only")
        cleared = insignificant_bits(sketches)
        values = self._sketch_slots - (sketches == EMPTY_SLOT).sum(axis=1)
        prefix["values"], prefix["cleared"] = values, cleared
        kept = np.zeros((n, self._sketch_slots_stored), dtype=_LANE)
        kept[:, : self._sketch_slots] = sketches >> cleared[:, None]
        return _three_bytes_each(kept), values * _SKETCH_VALUE_BYTES

    def _payload_lengths(self, prefix: np.ndarray) -> np.ndarray:
        if self.payload == BYTES_PAYLOAD:
            return np.full(len(prefix), self.payload_bytes)
        return prefix["values"].astype(np.int64) * _SKETCH_VALUE_BYTES

    def _read_payloads(self, flat: np.ndarray, at: np.ndarray, prefix: np.ndarray) -> np.ndarray:
        """The payloads of records whose payload starts at ``at``."""
        if self.payload == BYTES_PAYLOAD:
            return _rows_at(flat, at, self.payload_bytes)
        k = self._sketch_slots
        stored = _rows_at(flat, at, self._sketch_slots_stored * _SKETCH_VALUE_BYTES)
        sketches = _from_three_bytes_each(stored)[:, :k] << prefix["cleared"].astype(np.uint32)[:, None]
        sketches[~_leading(prefix["values"], k)] = EMPTY_SLOT
        return sketches.view(np.uint8)


def origins_of(heads: np.ndarray) -> np.ndarray:
    """The heads' origins as :data:`ORIGIN` rows."""
    origins = np.empty(len(heads), dtype=ORIGIN)
    for name in ORIGIN.names or ():
        origins[name] = heads[name]
    return origins


def _three_bytes_each(values: np.ndarray) -> np.ndarray:
    """(rows, 3 * slots) uint8: the low 3 bytes of each value (under 2**24), little-endian, one after another;
    slots a multiple of 4, so 4 values are 3 whole uint32 words."""
    v = values.reshape(len(values), values.shape[1] // 4, 4)
    words = np.empty((len(values), v.shape[1], 3), dtype=_LANE)
    words[:, :, 0] = v[:, :, 0] | (v[:, :, 1] << np.uint32(24))
    words[:, :, 1] = (v[:, :, 1] >> np.uint32(8)) | (v[:, :, 2] << np.uint32(16))
    words[:, :, 2] = (v[:, :, 2] >> np.uint32(16)) | (v[:, :, 3] << np.uint32(8))
    return words.reshape(len(values), v.shape[1] * 3).view(np.uint8)


def _from_three_bytes_each(stored: np.ndarray) -> np.ndarray:
    """The values :func:`_three_bytes_each` stored (rows of bytes, contiguous)."""
    words = stored.view(_LANE).reshape(len(stored), stored.shape[1] // 12, 3)
    low = np.uint32(0xFFFFFF)
    values = np.empty((len(stored), words.shape[1], 4), dtype=_LANE)
    values[:, :, 0] = words[:, :, 0] & low
    values[:, :, 1] = (words[:, :, 0] >> np.uint32(24)) | ((words[:, :, 1] << np.uint32(8)) & low)
    values[:, :, 2] = (words[:, :, 1] >> np.uint32(16)) | ((words[:, :, 2] << np.uint32(16)) & low)
    values[:, :, 3] = words[:, :, 2] >> np.uint32(8)
    return values.reshape(len(stored), words.shape[1] * 4)


def _leading(counts: np.ndarray, width: int) -> np.ndarray:
    """(rows, width) bool: each row's first ``counts[row]`` positions."""
    return np.arange(width) < counts[:, None]


def _rows_at(flat: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """(rows, width) uint8: the ``width`` bytes of ``flat`` from each start, a row copied whole at a time."""
    return sliding_window_view(flat, width)[starts]
