"""Bottom-k MinHash, as in "Simhashing (hopefully) made simple": one hash function, the k least values.

The sketch of a document is the k smallest 31-bit hashes of its distinct features, ascending: by default
the top 31 bits of the features' own 44-bit identity hashes (seeded by the extractor, and already sorted per
document, so a sketch costs no sort), or with a ``seed`` those re-mixed into another hash function. 31 bits
keep the order of the values and, like b-bit minwise hashing, almost every distinction between them, in
4 bytes a value: the index stores half of what 64-bit values take, and the estimate compares half as many
bytes. Features whose values coincide in those bits count as one. Two sets
share their minimum with probability equal to their Jaccard index, and the k least values of one hash
function make a cluster key that needs k shared members to match and changes rarely as members come and
go. The Jaccard estimate between two sketches is the standard bottom-k one: among the k smallest distinct
values of the union of both sketches, the fraction present in both.
"""

from __future__ import annotations

import numpy as np

from .features import IDENTITY_BITS, MAX_DOCUMENTS, FeatureBatch, mix64

__all__ = ["EMPTY_SLOT", "SKETCH_BITS", "SKETCH_DTYPE", "BottomK"]

SKETCH_BITS = 31
SKETCH_DTYPE = np.dtype(np.uint32)
EMPTY_SLOT = np.uint32(2**32 - 1)
"""Pads a sketch whose document has fewer than k distinct values; never a real sketch value."""

_VALUE_BITS = np.uint64(SKETCH_BITS)
_IDENTITY_SHIFT = np.uint64(IDENTITY_BITS - SKETCH_BITS)
_MIXED_SHIFT = np.uint64(64 - SKETCH_BITS)
_VALUE_MASK = np.uint64((1 << SKETCH_BITS) - 1)


class BottomK:
    """Bottom-k sketches of :class:`FeatureBatch` documents, vectorised over the batch."""

    def __init__(self, k: int = 128, seed: int | None = None) -> None:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if seed is not None and not 0 <= seed < 2**64:
            raise ValueError(f"seed must be None or in [0, 2**64), got {seed}")
        self.k = k
        # Distinct stand-ins for a pair of sketches' padding, above every 31-bit value.
        self._pad_values = np.arange(2 * k, dtype=SKETCH_DTYPE) + SKETCH_DTYPE.type(1 << SKETCH_BITS)
        self.seed = seed

    def sketch(self, features: FeatureBatch) -> np.ndarray:
        """uint32 (documents, k): each row's k least values ascending, padded with :data:`EMPTY_SLOT`."""
        documents = len(features)
        if documents > MAX_DOCUMENTS:
            raise ValueError(f"at most {MAX_DOCUMENTS} documents per sketch call, got {documents}")
        if self.seed is None:
            # Identities ascend within each document: (document, value) keys are sorted as they come.
            keys = (features.documents.astype(np.uint64) << _VALUE_BITS) | (features.identities >> _IDENTITY_SHIFT)
        else:
            # Re-mixing with the seed makes this hash function independent of the feature hash.
            mixed = mix64(features.hashes ^ np.uint64(self.seed)) >> _MIXED_SHIFT
            keys = np.sort((features.documents.astype(np.uint64) << _VALUE_BITS) | mixed)
        distinct = np.ones(len(keys), dtype=bool)
        distinct[1:] = keys[1:] != keys[:-1]
        keys = keys[distinct]
        values, owner = keys & _VALUE_MASK, (keys >> _VALUE_BITS).astype(np.int64)
        rank = np.arange(len(keys)) - np.searchsorted(owner, owner)
        kept = rank < self.k
        result = np.full((documents, self.k), EMPTY_SLOT, dtype=SKETCH_DTYPE)
        result[owner[kept], rank[kept]] = values[kept]
        return result

    def jaccard(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Estimated Jaccard index of each pair of rows of ``a`` and ``b`` (1.0 for two empty sketches)."""
        a, b = np.atleast_2d(a), np.atleast_2d(b)
        if a.shape != b.shape or a.shape[1] != self.k:
            raise ValueError(f"sketches must both have shape (n, {self.k}), got {a.shape} and {b.shape}")
        k = self.k
        counter = np.int16 if 2 * k <= np.iinfo(np.int16).max else np.int64
        merged = np.concatenate([a, b], axis=1)
        # Each pad becomes a value of its own above every real one: pads then never pair, and sort last.
        padding = merged == EMPTY_SLOT
        np.copyto(merged, self._pad_values, where=padding)
        real = 2 * k - padding.view(np.uint8).sum(axis=1, dtype=counter)
        # numpy's default sort is vectorised (SIMD) for unsigned integers: several times faster here than its
        # stable sort, though that merges the two sorted runs in one pass.
        merged.sort(axis=1)
        # Each sketch holds distinct values, so a value in both appears exactly twice, side by side: position
        # j + 1 repeats position j.
        repeat = merged[:, 1:] == merged[:, :-1]
        # The value at position j ranks j - (repeats before j) among the union's distinct values: below k for
        # every j < k, so only the later positions need the running count (a large share of the cost).
        early = repeat[:, :k].view(np.uint8).sum(axis=1, dtype=counter)
        late = repeat[:, k:]
        repeats_before = np.cumsum(late, axis=1, dtype=counter)
        np.subtract(repeats_before, late, out=repeats_before)
        np.add(repeats_before, early[:, None], out=repeats_before)
        in_top_k = repeats_before > np.arange(late.shape[1], dtype=counter)
        in_top_k &= late
        shared = early + in_top_k.view(np.uint8).sum(axis=1, dtype=counter)
        union = np.minimum(k, real - early - late.view(np.uint8).sum(axis=1, dtype=counter))
        return np.divide(shared, union, out=np.ones(len(union)), where=union > 0)

    def cluster_key(self, sketch: np.ndarray) -> bytes | list[bytes]:
        """A stable key-value-store key: the sketch's values as big-endian bytes (one key per row of a 2-D array)."""
        values = np.asarray(sketch, dtype=SKETCH_DTYPE)
        if values.ndim == 1:
            return values.astype(">u4").tobytes()
        return [row.tobytes() for row in values.astype(">u4")]
