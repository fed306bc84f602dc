"""Undo records: what each of the latest batches changed beyond its own entries, for ``rollback`` to put back.

``undo`` holds, per batch that stored entries, the last ``UNDO_BATCHES`` of them: the records it removed (expiry,
``max_entries`` eviction, a re-added id), the ``times`` rows it deleted or trimmed, the table rows it deleted (an
index of folds), the clock, its window, the count and the tables' unswept removals before it, and the merge turn
the index takes up again when it is undone.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from .store import Store, seq_bytes

__all__ = ["UNDO_BATCHES", "Undo", "UndoRecord", "UndoRecords"]

_U64, _I64 = np.dtype("<u8"), np.dtype("<i8")
_NPZ_MAGIC = b"PK\x03\x04"  # a zip archive's first bytes

UNDO_BATCHES = 16
"""Batches that stored entries whose changes ``rollback`` can undo exactly: the service has at most two
uncommitted in Kafka, and a batch that fails in part is stored in several."""


@dataclass
class Undo:
    """One batch's changes beyond its own entries (``first_seq`` on): the state before it of the clock, its window
    and the count; the records it removed; the ``times`` rows it deleted or trimmed (None: a row it added); on a
    fold-valued index, the table rows it deleted (table, key, value); the merge turn to take up again once it and
    the batches after it are undone, and the tables' unswept removals before it."""

    first_seq: int
    count: int
    clock: bytes | None
    window: bytes | None
    removed_seqs: list[np.ndarray]
    removed_heads: list[np.ndarray]
    removed_ids: list[bytes]
    times: dict[bytes, bytes | None]
    table_rows: list[tuple[int, np.ndarray, np.ndarray]]
    merge_turn: int | None = None
    unswept: bytes | None = None

    def pack(self) -> bytes:
        seqs = np.concatenate(self.removed_seqs) if self.removed_seqs else np.zeros(0, np.uint64)
        heads = np.concatenate(self.removed_heads) if self.removed_heads else np.zeros(0, np.uint8)
        rows = self.table_rows
        # msgpack, arrays as their little-endian bytes: microseconds a batch, where an .npz archive of a dozen
        # small arrays costs about a millisecond.
        return msgpack.packb(
            {
                "first_seq": int(self.first_seq),
                "count": int(self.count),
                "clock": self.clock,
                "window": self.window,
                "seqs": seqs.astype(_U64).tobytes(),
                "heads": heads.tobytes(),
                "ids": self.removed_ids,
                "times": list(self.times.items()),
                "row_tables": np.concatenate([np.full(len(k), t, _I64) for t, k, _ in rows]).tobytes() if rows else b"",
                "row_keys": np.concatenate([k for _, k, _ in rows]).astype(_U64).tobytes() if rows else b"",
                "row_values": np.concatenate([v for _, _, v in rows]).astype(_U64).tobytes() if rows else b"",
                "merge_turn": self.merge_turn,
                "unswept": self.unswept,
            }
        )


@dataclass(frozen=True)
class UndoRecord:
    """A stored :class:`Undo`, as ``rollback`` reads it."""

    first_seq: int
    count: int
    clock: bytes | None
    window: bytes | None
    seqs: np.ndarray
    heads: np.ndarray
    ids: list[bytes]
    times: list[tuple[bytes, bytes | None]]
    rows: tuple[np.ndarray, np.ndarray, np.ndarray]
    merge_turn: int | None = None
    unswept: bytes | None = None

    @classmethod
    def unpack(cls, raw: bytes, record: np.dtype) -> UndoRecord:
        if raw.startswith(_NPZ_MAGIC):
            return cls._unpack_npz(raw, record)
        a = msgpack.unpackb(raw, raw=False)
        return cls(
            a["first_seq"],
            a["count"],
            a["clock"],
            a["window"],
            np.frombuffer(a["seqs"], dtype=_U64).astype(np.uint64),
            np.frombuffer(a["heads"], dtype=record),
            a["ids"],
            [(key, value) for key, value in a["times"]],
            (
                np.frombuffer(a["row_tables"], dtype=_I64).astype(np.int64),
                np.frombuffer(a["row_keys"], dtype=_U64).astype(np.uint64),
                np.frombuffer(a["row_values"], dtype=_U64).astype(np.uint64),
            ),
            a.get("merge_turn"),
            a.get("unswept"),
        )

    @classmethod
    def _unpack_npz(cls, raw: bytes, record: np.dtype) -> UndoRecord:
        """A record stored as an .npz archive, as earlier versions of streamdedup wrote them."""
        with np.load(io.BytesIO(raw), allow_pickle=False) as arrays:
            a = {name: arrays[name] for name in arrays.files}
        first_seq, count = a["header"].tolist()
        has_clock, has_window = a["has_clock"].tolist()
        ids_buffer, id_stops = a["ids"].tobytes(), np.cumsum(a["id_lengths"]).tolist()
        # Starts and stops pair up (strict=False: with none stored, the start [0] pairs with nothing).
        ids = [ids_buffer[low:high] for low, high in zip([0, *id_stops[:-1]], id_stops, strict=False)]
        key_buffer, values_buffer = a["time_keys"].tobytes(), a["time_values"].tobytes()
        value_stops = np.cumsum(a["time_lengths"]).tolist()
        times = [
            (key_buffer[16 * i : 16 * i + 16], values_buffer[low:high] if present else None)
            for i, (present, low, high) in enumerate(
                zip(a["time_present"].tolist(), [0, *value_stops[:-1]], value_stops, strict=False)
            )
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


class UndoRecords:
    """The ``undo`` database of one store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def save(self, txn: Any, undo: Undo) -> None:
        """Store the undo record of the batch this transaction stores, and drop the oldest beyond UNDO_BATCHES."""
        txn.put(seq_bytes(np.array([undo.first_seq]))[0], undo.pack(), db=self.store.undo)
        if txn.stat(self.store.undo)["entries"] > UNDO_BATCHES:
            with txn.cursor(self.store.undo) as cursor:
                if cursor.first():
                    cursor.delete()

    def newest_first(self, txn: Any) -> Iterator[tuple[bytes, bytes]]:
        with txn.cursor(self.store.undo) as cursor:
            records = list(cursor.iterprev()) if cursor.last() else []
        return iter(records)

    def restorable_seqs(self, txn: Any) -> np.ndarray:
        """Entry keys of the removed entries a rollback may restore."""
        seqs = [UndoRecord.unpack(raw, self.store.fmt.record).seqs for _, raw in self.newest_first(txn)]
        return np.unique(np.concatenate(seqs)) if seqs else np.zeros(0, np.uint64)

    def forget(self, txn: Any) -> None:
        """Drop every undo record: after a removal outside a batch, undoing an older batch would not restore
        the index it met."""
        txn.drop(self.store.undo, delete=False)
