"""The content index: the entries that the tables could not lead an exact copy to, by a 64-bit hash of their
fingerprint and payload.

``dedup.key_capacity`` bounds the rows a table key leads to, so a key that many documents share (a template, a
common phrase) takes no more once full. A document stored under few keys (a short, common text: "New upstream
release.", "Valid values are:") is then found through the tables by none of its copies, or ranked among the many
earlier documents that share those keys and cut by ``dedup.max_candidates``: every copy of it would be published.
Such documents (stored under at most ``FEW_KEYS`` keys) get a row here, and a document that the tables leave
without a match is looked up here, so their exact copies are caught whatever the keys. Rows are kept as
``hashed_runs`` keeps them; what a probe finds is a candidate, verified on its record like any other (collisions,
removed entries). Indexes created before format 9 have no contents.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np

from .hashed_runs import HashedRuns
from .store import META_UNSWEPT_CONTENTS, Store, mixed_in

__all__ = ["FEW_KEYS", "Contents", "NoContents", "content_hashes", "content_index"]

FEW_KEYS = 2
"""Documents stored under at most this many table keys get a content row (about one kept document in 17 of the
growth benchmark's natural text): an exact copy shares with its original only the keys the original was stored
under, and two keys are what a common phrase shares with many documents."""
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
        # Few entries have a row (about one in 17 kept on natural text: 16 bytes of memory for each) and every
        # batch probes them: held in memory, a probe costs no read.
        super().__init__(store, db, META_UNSWEPT_CONTENTS, rows_in_memory=True)

    def find(self, txn: Any, fps: np.ndarray, payloads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The entries that may hold each row's fingerprint and payload: the row (ascending) and the entry key of
        each row found. To be confirmed on the entries' records: some are removed, a few collide."""
        return self.read(txn, content_hashes(fps, payloads))

    def add(self, txn: Any, fps: np.ndarray, payloads: np.ndarray, seqs: np.ndarray, keys_stored: np.ndarray) -> None:
        """Store the contents of the new entries stored under at most ``FEW_KEYS`` table keys (``keys_stored``
        each): one run."""
        few = np.flatnonzero(keys_stored <= FEW_KEYS)
        if len(few):
            self.insert(txn, content_hashes(fps[few], payloads[few]), seqs[few])


class NoContents:
    """An index created before format 9: no content rows, so nothing is stored, removed or found by content."""

    def find(self, txn: Any, fps: np.ndarray, payloads: np.ndarray) -> None:
        """Nothing: exact copies are found through the tables alone."""

    def add(self, txn: Any, fps: np.ndarray, payloads: np.ndarray, seqs: np.ndarray, keys_stored: np.ndarray) -> None:
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
