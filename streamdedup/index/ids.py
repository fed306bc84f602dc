"""The id index: the entry that holds each stored document id, for lookups by id (a redelivered record, a
re-added id, removal by id).

Two layouts; the index's format says which (``IndexFormat.id_layout``):

- ``keys`` (indexes created before format 8): one row per entry in ``ids``, keyed by its id (ids longer than
  ``MAX_ID_KEY_BYTES`` by their BLAKE2b digest). Ids come in no particular order, so a batch's rows land on
  random B-tree pages: on an index of 500,000 entries nearly every id stored dirties a page of its own, which
  the commit writes out again.
- ``runs``: rows of (64-bit hash of the id, entry key) in ``ids``, as ``hashed_runs`` keeps them: written in
  appended runs, each hash found confirmed on its entry's record, which holds the id (ids whose hashes collide
  cost a record read, never a wrong answer), rows of removed entries swept in bulk.

Either way the key filter comes first: it proves most ids of a batch new, and those are not looked up here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .hashed_runs import HashedRuns
from .store import MAX_ID_KEY_BYTES, META_UNSWEPT_IDS, U64, Store, id_hashes, keys_of_ids, seq_bytes

__all__ = ["HashedIds", "IdKeys", "Ids", "id_index"]


def _none() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.uint64)


class IdKeys:
    """The ``keys`` layout."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def find(self, txn: Any, id_bytes: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """The position in ``id_bytes`` of each stored id (ascending), and its entry key."""
        keys = keys_of_ids(id_bytes)
        with txn.cursor(self.store.ids) as cursor:
            found = dict(cursor.getmulti(keys))
        if not found:
            return _none()
        at = [i for i, key in enumerate(keys) if key in found]
        seqs = np.frombuffer(b"".join(found[keys[i]] for i in at), dtype=U64).astype(np.uint64)
        return np.asarray(at, dtype=np.intp), seqs

    def add(self, txn: Any, id_bytes: list[bytes], seqs: np.ndarray) -> None:
        """Store the ids of new entries (none of them stored)."""
        with txn.cursor(self.store.ids) as cursor:
            cursor.putmulti(zip(keys_of_ids(id_bytes), seq_bytes(seqs), strict=True))

    def removed(self, txn: Any, id_bytes: list[bytes], seqs: np.ndarray) -> None:
        """The entries of these ids were removed."""
        for key in keys_of_ids(id_bytes):
            txn.delete(key, db=self.store.ids)

    def restored(self, txn: Any, id_bytes: list[bytes], seqs: np.ndarray) -> None:
        """Removed entries were put back as they were."""
        self.add(txn, id_bytes, seqs)

    def sweep(self, txn: Any, live: Callable[[], np.ndarray]) -> None:
        """Nothing to sweep: an id's row goes with its entry."""


class HashedIds:
    """The ``runs`` layout."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.runs = HashedRuns(store, store.ids, META_UNSWEPT_IDS)

    def find(self, txn: Any, id_bytes: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """The position in ``id_bytes`` of each stored id (ascending), and its entry key."""
        if not id_bytes:
            return _none()
        positions, seqs = self.runs.read(txn, _hashes(id_bytes))
        if not len(positions):
            return _none()
        entries, _, record_ids = self.store.stored_records(txn, np.unique(seqs), payloads=False)
        if not len(entries):
            return _none()
        slots = np.minimum(np.searchsorted(entries, seqs), len(entries) - 1)
        held = (entries[slots] == seqs).tolist()
        stored_ids = record_ids.encoded()
        # Rows found are ids stored (rare: a replay, a redelivery) and hash collisions: a step each.
        confirmed = sorted(
            {
                (position, seq)
                for position, seq, slot, stored in zip(
                    positions.tolist(), seqs.tolist(), slots.tolist(), held, strict=True
                )
                if stored and stored_ids[slot] == id_bytes[position]
            }
        )
        if not confirmed:
            return _none()
        found_at, found_seqs = zip(*confirmed, strict=True)
        return np.array(found_at, dtype=np.intp), np.array(found_seqs, dtype=np.uint64)

    def add(self, txn: Any, id_bytes: list[bytes], seqs: np.ndarray) -> None:
        """Store the ids of new entries (none of them stored): one run."""
        self.runs.insert(txn, _hashes(id_bytes), seqs)

    def removed(self, txn: Any, id_bytes: list[bytes], seqs: np.ndarray) -> None:
        """The entries of these ids were removed: their rows stay until a sweep."""
        self.runs.removed(txn, len(seqs))

    def restored(self, txn: Any, id_bytes: list[bytes], seqs: np.ndarray) -> None:
        """Removed entries were put back as they were: their rows stayed."""
        self.runs.restored(txn, len(seqs))

    def sweep(self, txn: Any, live: Callable[[], np.ndarray]) -> None:
        """Sweep the rows of removed entries when due (see ``hashed_runs``)."""
        self.runs.sweep(txn, live)


Ids = IdKeys | HashedIds


def id_index(store: Store) -> Ids:
    """The ids of ``store``, in the layout its format records."""
    return HashedIds(store) if store.fmt.id_layout == "runs" else IdKeys(store)


def _hashes(id_bytes: list[bytes]) -> np.ndarray:
    """A 64-bit hash of every byte of each id's key."""
    return id_hashes(keys_of_ids(id_bytes), hashed_bytes=MAX_ID_KEY_BYTES)
