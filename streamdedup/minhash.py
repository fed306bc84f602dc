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
_MERGED_PER_BLOCK = 1 << 16
"""Merged sketch values :meth:`BottomK.jaccard` works on at a time."""


class BottomK:
    """Bottom-k sketches of :class:`FeatureBatch` documents, vectorised over the batch."""

    def __init__(self, k: int = 128, seed: int | None = None) -> None:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if seed is not None and not 0 <= seed < 2**64:
            raise ValueError(f"seed must be None or in [0, 2**64), got {seed}")
        self.k = k
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
        k, pairs, width = self.k, len(a), 2 * self.k
        # Blocks of rows keep the working arrays in cache, and the same arrays serve every block.
        rows = max(1, min(pairs, _MERGED_PER_BLOCK // width))
        merged_rows = np.empty((rows, width), dtype=np.result_type(a, b))
        changes = np.empty(rows * width - 1, dtype=bool)
        counts = np.zeros(rows * width, dtype=np.int32)
        row_starts = np.arange(0, rows * width, width)
        top = np.empty(pairs, dtype=np.int32)
        below_top = np.empty(pairs, dtype=np.intp)
        for start in range(0, pairs, rows):
            stop = min(pairs, start + rows)
            size = (stop - start) * width
            merged = merged_rows[: stop - start]
            np.concatenate([a[start:stop], b[start:stop]], axis=1, out=merged)
            # numpy's default sort is vectorised (SIMD) for unsigned integers: several times faster here than its
            # stable sort, though that merges the two sorted runs in one pass. Pads sort last, as one value.
            merged.sort(axis=1)
            flat = merged.ravel()
            np.not_equal(flat[1:], flat[:-1], out=changes[: size - 1])
            # Changes counted over the whole block ascend across it, and a position's rank among its row's distinct
            # values is its count less that of the row's first position.
            np.cumsum(changes[: size - 1].view(np.uint8), dtype=np.int32, out=counts[1:size])
            first, last = counts[:size:width], counts[width - 1 : size : width]
            # The union's size, at most k: the row's distinct values, the pads' one excepted.
            block_top = top[start:stop]
            np.subtract(last, first, out=block_top)
            block_top += merged[:, -1] != EMPTY_SLOT
            np.minimum(block_top, k, out=block_top)
            # The positions ranked below it hold the union's least values, a value in both sketches twice: one
            # search over the block finds how many there are in each row.
            found = np.searchsorted(counts[:size], first + block_top)
            np.subtract(found, row_starts[: stop - start], out=below_top[start:stop])
        # The search lands past a row whose ranks all stay below its union's size.
        np.minimum(below_top, width, out=below_top)
        return np.divide(below_top - top, top, out=np.ones(pairs), where=top > 0)

    def cluster_key(self, sketch: np.ndarray) -> bytes | list[bytes]:
        """A stable key-value-store key: the sketch's values as big-endian bytes (one key per row of a 2-D array)."""
        values = np.asarray(sketch, dtype=SKETCH_DTYPE)
        if values.ndim == 1:
            return values.astype(">u4").tobytes()
        return [row.tobytes() for row in values.astype(">u4")]
