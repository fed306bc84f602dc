"""The content index: every stored entry by a 64-bit hash of its fingerprint and payload.

A document is looked up here before the tables: an exact copy, the most common duplicate of natural feeds (a third
of the documents of the growth benchmark's text once its index holds half a million), costs one probe here, where
the tables would read a few dozen rows of its keys and rank them. What the tables leave to it too: ``dedup.
key_capacity`` bounds the rows a table key leads to, so a document stored under few keys (a short, common text:
"New upstream release.", "Valid values are:") is found through the tables by none of its copies, or ranked among
the many earlier documents that share those keys and cut by ``dedup.max_candidates``; here its exact copies are
caught whatever the keys. Rows are kept as ``hashed_runs`` keeps them, searched in place in the map; what a probe
finds is a candidate, verified on its record like any other (collisions, removed entries). Indexes created before
format 9 have no contents: the tables alone find their copies.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from .hashed_runs import HashedRuns
from .store import META_UNSWEPT_CONTENTS, Store, mixed_in

__all__ = ["Contents", "NoContents", "content_hashes", "content_index"]

_SEED = np.uint64(0x243F6A8885A308D3)
_MULTIPLIER_SEED = 0x13198A2E


def content_hashes(fps: np.ndarray, payloads: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row's fingerprint words ((n, words) uint64) and payload bytes ((n, bytes) uint8): each
    word times an odd constant of its own (a bijection, so rows that differ in one word never collide), folded by
    xor over the whole batch at once, then mixed."""
    fps = np.asarray(fps, dtype=np.uint64).reshape(len(fps), -1)
    words = _payload_words(payloads)
    multipliers = _multipliers(fps.shape[1] + words.shape[1])
    folded = np.bitwise_xor.reduce(fps * multipliers[: fps.shape[1]], axis=1)
    if words.shape[1]:
        folded ^= np.bitwise_xor.reduce(words * multipliers[fps.shape[1] :], axis=1)
    return mixed_in(folded, _SEED)


def _payload_words(payloads: np.ndarray) -> np.ndarray:
    """(n, bytes) uint8 -> (n, words) uint64, zero-padded to whole words (a view when they fill them)."""
    n, size = payloads.shape
    if size % 8 == 0 and payloads.flags.c_contiguous:
        return payloads.view("<u8")
    padded = np.zeros((n, -(-size // 8) * 8), dtype=np.uint8)
    padded[:, :size] = payloads
    return padded.view("<u8")


@cache
def _multipliers(count: int) -> np.ndarray:
    """``count`` odd 64-bit constants, the same in every process."""
    drawn = np.random.default_rng(_MULTIPLIER_SEED).integers(0, 2**64, size=count, dtype=np.uint64)
    return drawn | np.uint64(1)


class Contents(HashedRuns):
    """Rows of (content hash, entry key) in the ``contents`` database."""

    def __init__(self, store: Store, db: Any) -> None:
        super().__init__(store, db, META_UNSWEPT_CONTENTS)

    def find(self, txn: Any, fps: np.ndarray, payloads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The entries that may hold each row's fingerprint and payload: the row (ascending) and the entry key of
        each row found. To be confirmed on the entries' records: some are removed, a few collide."""
        return self.read(txn, content_hashes(fps, payloads))

    def add(self, txn: Any, fps: np.ndarray, payloads: np.ndarray, seqs: np.ndarray) -> None:
        """Store the contents of the new entries: one run."""
        self.insert(txn, content_hashes(fps, payloads), seqs)


class NoContents:
    """An index created before format 9: no content rows, so nothing is stored, removed or found by content."""

    def find(self, txn: Any, fps: np.ndarray, payloads: np.ndarray) -> None:
        """Nothing: exact copies are found through the tables alone."""

    def add(self, txn: Any, fps: np.ndarray, payloads: np.ndarray, seqs: np.ndarray) -> None:
        """Nothing to store."""

    def removed(self, txn: Any, count: int) -> None:
        """No rows to sweep later."""

    def restored(self, txn: Any, count: int) -> None:
        """No rows to count."""

    def sweep(self, txn: Any, live: Callable[[], np.ndarray]) -> None:
        """No rows to sweep."""


def content_index(store: Store) -> Contents | NoContents:
    """The contents of ``store``, in the layout its format records (none before format 9)."""
    return NoContents() if store.contents is None else Contents(store, store.contents)
