"""Dense SimHash (Charikar) fingerprints of whole batches: normalise -> features -> weighted bit sums.

Bit order (the project's contract): bit i of a ``width``-bit fingerprint is bit ``63 - i % 64`` of uint64
word ``i // 64``, so the hex string of the words reads the bits left to right. A feature hash's bit i is
the same bit of its digest, and fingerprint bit i is set where the weighted sum of +1 (bit set) / -1 (bit
clear) over the document's features is > 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from .features import (
    MAX_DOCUMENTS,
    FeatureBatch,
    FeatureExtractor,
    among_first,
    route_of,
)
from .normalize import CodePointBatch, Normalizer
from .settings import FeatureSettings, FingerprintSettings

__all__ = [
    "FingerprintBatch",
    "Fingerprinter",
    "fingerprint_hex",
    "segmented_simhash",
    "simhash_from_bits",
    "simhash_from_features",
]

# Code points per extraction pass: the pass's temporaries then stay in cache, where a whole batch's would be
# page-faulted in afresh each time (10-20 kB documents: 11.5 MB/s at 2**20, 17-20 MB/s at this size).
_CHUNK_CODE_POINTS = 1 << 18
# Feature-bit cells per summation pass (memory, not speed).
_CHUNK_CELLS = 1 << 23
_LANE_LIMIT = 255  # words summed per block: the byte counters of _ones_per_bit hold up to 255
_BYTE_LANES = np.uint64(0x0101010101010101)
_SIZE_CLASSES = ((0, 8), (8, 16), (16, 32), (32, 64), (64, 128), (128, 1 << 62))  # features per document


def simhash_from_bits(
    bits: np.ndarray, weights: np.ndarray | Sequence[float] | None = None, active_bits: int | None = None
) -> np.ndarray:
    """SimHash of one document from its (features x width) 0/1 feature-hash bits.

    Dense (``active_bits`` None): bit set where the weighted sum of +1/-1 is > 0. Sparse: the
    ``active_bits`` largest sums are set, ties going to the lowest index; no features give all zeros.
    """
    bits = np.asarray(bits)
    if bits.ndim != 2:
        raise ValueError(f"bits must be a (features x width) array, got shape {bits.shape}")
    count, width = bits.shape
    weight = np.ones(count) if weights is None else np.asarray(weights, dtype=np.float64)
    if weight.shape != (count,):
        raise ValueError(f"weights must have one value per feature ({count}), got shape {weight.shape}")
    sums = np.where(bits != 0, weight[:, None], -weight[:, None]).sum(axis=0)
    result = np.zeros(width, dtype=np.uint8)
    if active_bits is None:
        result[sums > 0] = 1
        return result
    if not 0 <= active_bits <= width:
        raise ValueError(f"active_bits must be between 0 and the width {width}, got {active_bits}")
    if count:
        # A stable sort of the negated sums keeps equal sums in index order.
        result[np.argsort(-sums, kind="stable")[:active_bits]] = 1
    return result


def simhash_from_features(features: FeatureBatch) -> np.ndarray:
    """Dense SimHash of every document of a feature batch: uint64 (documents, words)."""
    documents = len(features)
    words = features.digests.shape[1]
    result = np.zeros((documents, words), dtype=np.uint64)
    counts = features.counts
    unit = bool(np.all(features.weights == 1.0))
    # Documents are grouped by size and each group's features laid out as (blocks, depth, words), padded
    # with zero words: reductions along the middle axis stay vectorised over the bits, unlike a segmented
    # one, and grouping by size keeps the padding small.
    for low, high in _SIZE_CLASSES:
        rows = np.flatnonzero((counts > low) & (counts <= high))
        depth = min(high, _LANE_LIMIT)
        per_run = max(1, _CHUNK_CELLS // (depth * words * 64))
        first = 0
        while first < len(rows):
            # Runs of documents whose blocks fit the cell budget (a huge document is a run of its own and
            # is then summed in slices).
            blocks = -(-counts[rows[first:]] // depth)
            last = first + max(1, int(np.searchsorted(np.cumsum(blocks), per_run, side="right")))
            run = rows[first:last]
            if unit:
                result[run] = _sum_unit(features, run, depth)
            else:
                result[run] = _sum_weighted(features, run)
            first = last
    return result


def _sum_unit(features: FeatureBatch, rows: np.ndarray, depth: int) -> np.ndarray:
    """Dense SimHash of unweighted documents: bit set where more than half of the features have it."""
    counts = features.counts[rows]
    blocks = -(-counts // depth)
    block_starts = np.cumsum(blocks) - blocks
    rank = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    source = np.repeat(features.offsets[rows], counts) + rank
    words = features.digests.shape[1]
    # Padding words are all zero: they add no ones, and the threshold uses the real count.
    padded = np.zeros((int(blocks.sum()), depth, words), dtype=np.uint64)
    padded[np.repeat(block_starts, counts) + rank // depth, rank % depth] = features.digests[source]
    ones = _ones_per_bit(padded)
    if len(ones) != len(rows):
        ones = np.add.reduceat(ones, block_starts, axis=0)
    # Integer counts: exact, and ties (sum 0) stay clear.
    return np.packbits(2 * ones > counts[:, None], axis=1).view(">u8")


def _sum_weighted(features: FeatureBatch, rows: np.ndarray) -> np.ndarray:
    """Dense SimHash of weighted documents, one document at a time in slices of the cell budget."""
    words = features.digests.shape[1]
    step = max(1, _CHUNK_CELLS // (words * 64))
    result = np.zeros((len(rows), words), dtype=np.uint64)
    for index, row in enumerate(rows.tolist()):
        sums = np.zeros(words * 64)
        for first in range(int(features.offsets[row]), int(features.offsets[row + 1]), step):
            last = min(first + step, int(features.offsets[row + 1]))
            bits = _bits(features.digests[first:last])
            weights = features.weights[first:last, None]
            sums += np.where(bits != 0, weights, -weights).sum(axis=0)
        result[index] = np.packbits(sums > 0).view(">u8")
    return result


def _bits(digests: np.ndarray) -> np.ndarray:
    """0/1 bits of digest words along a new last axis; big-endian bytes put bit 0 (the most significant
    bit of word 0) first for unpackbits."""
    as_bytes = digests.astype(">u8").view(np.uint8)
    return np.unpackbits(as_bytes, axis=-1)


def _ones_per_bit(words: np.ndarray) -> np.ndarray:
    """For (groups, n, w) uint64 words with n <= 255: how many of each group's n words have each of the
    w * 64 bits set (fingerprint bit order), as int64 (groups, w * 64).

    SWAR: masking bit k of every byte leaves eight one-bit counters per word; summing n <= 255 of them
    cannot carry out of a byte, so eight masked sums count all 64 bits with 64-bit arithmetic only.
    """
    groups, _, width = words.shape
    counts = np.empty((groups, width, 8, 8), dtype=np.int64)  # (group, word, byte, bit within byte)
    for bit in range(8):
        lanes = (words >> np.uint64(bit)) & _BYTE_LANES
        counts[:, :, :, bit] = lanes.sum(axis=1).view(np.uint8).reshape(groups, width, 8)
    # Little-endian: byte b, bit k is bit 8b + k counted from the least significant; fingerprint bit i is
    # the (63 - i)-th from the least significant of its word.
    return counts.reshape(groups, width, 64)[:, :, ::-1].reshape(groups, width * 64)


def fingerprint_hex(fingerprints: np.ndarray) -> list[str]:
    """Hex string of each fingerprint row (each word as 16 hex digits, words in order: the bits read left
    to right). One hex conversion for the whole array, then cut per row."""
    rows = np.atleast_2d(np.asarray(fingerprints, dtype=np.uint64))
    digits = rows.astype(">u8").tobytes().hex()
    step = rows.shape[1] * 16
    return [digits[start : start + step] for start in range(0, len(digits), step)]


# Deepest segment group the bit-sliced majority takes; deeper ones (unsampled long texts) use a reduction.
_MAJORITY_DEPTH = 64


def segmented_simhash(
    features: FeatureBatch, width: int, segments: int, *, min_features: int = 1, sample: int = 0
) -> np.ndarray:
    """Feature-partitioned SimHash: uint64 (documents, width // 64).

    Each feature feeds exactly one of ``segments`` equal segments (its route, :func:`route_of` of its identity)
    and each segment is the Charikar SimHash of its own features, over ``width // segments`` bits. A small edit
    changes the few segments its features fall in and leaves the others bit-for-bit equal, so the index can key
    one table per segment and find the copy through any untouched one. ``sample`` > 0 (a multiple of
    ``segments``) builds each segment from its ``sample // segments`` features of least identity, a bottom-k
    sample per segment: a long document has as few features per segment as a short one, and a feature that
    enters or leaves one segment's sample changes no other segment. A segment with fewer than
    ``min_features`` features is left all zero (unkeyed), unless no segment of the document reaches that, in
    which case every non-empty segment counts: short texts stay findable.
    """
    seg_bits = width // segments
    if width % segments or seg_bits > 64 or 64 % seg_bits:
        raise ValueError(
            f"segments must split width {width} into equal parts of 1..64 bits dividing 64, got {segments}"
        )
    if sample % segments:
        raise ValueError(f"sample must be a multiple of the {segments} segments, got {sample}")
    documents = len(features)
    hashes, weights, counts = features.hashes, features.weights, features.counts
    cells = documents * segments
    # Features come in identity order within each document, and routes keep that order: each document's
    # features of one segment are contiguous, least identity first, and the groups are in cell order.
    group = route_of(features.identities, segments)
    group += np.repeat(np.arange(0, cells, segments, dtype=np.intp), counts)
    sizes = np.bincount(group, minlength=cells)
    per_segment = sample // segments
    if per_segment and sizes.max(initial=0) > per_segment:
        kept = np.flatnonzero(among_first(group, per_segment))
        group, hashes, weights = group[kept], hashes[kept], weights[kept]
        sizes = np.minimum(sizes, per_segment)
    values: np.ndarray = np.zeros(cells, dtype=np.uint64)
    unit = bool(np.all(weights == 1.0))
    if len(group) and unit and seg_bits == 32 and sizes.max() <= _MAJORITY_DEPTH:
        values = _majority32((hashes >> np.uint64(32)).astype(np.uint32), group, sizes)
    elif len(group):
        starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        if unit:
            leading = _leading_bits(hashes, seg_bits)
            # Unit weights: a bit is set where more than half of the segment's features have it.
            group_sizes = sizes[group[starts]]
            widest = int(group_sizes.max())
            dtype = np.uint8 if widest < 1 << 8 else np.uint16 if widest < 1 << 16 else np.uint32
            ones = np.add.reduceat(leading, starts, axis=0, dtype=dtype)
            set_bits = ones.astype(np.int64) * 2 > group_sizes[:, None]
        else:
            signed = (_leading_bits(hashes, seg_bits).astype(np.float64) * 2.0 - 1.0) * weights[:, None]
            set_bits = np.add.reduceat(signed, starts, axis=0) > 0
        packed_bits = np.zeros((len(starts), 8), dtype=np.uint8)
        packed_bits[:, : -(-seg_bits // 8)] = np.packbits(set_bits, axis=1)
        values[group[starts]] = packed_bits.view(">u8").ravel() >> np.uint64(64 - seg_bits)
    values = values.reshape(documents, segments)
    sizes = sizes.reshape(documents, segments)
    keyed = sizes >= min_features
    fallback = ~keyed.any(axis=1)
    keyed[fallback] = sizes[fallback] > 0
    values[~keyed] = 0
    per_word = 64 // seg_bits
    words = np.zeros((documents, width // 64), dtype=np.uint64)
    for slot in range(per_word):
        words |= values[:, slot::per_word] << np.uint64(seg_bits * (per_word - 1 - slot))
    return words


def _leading_bits(hashes: np.ndarray, bits: int) -> np.ndarray:
    """(n, bits) uint8: the leading ``bits`` bits of each hash, most significant first."""
    return np.unpackbits(hashes.astype(">u8").view(np.uint8).reshape(-1, 8)[:, : -(-bits // 8)], axis=1)[:, :bits]


def _majority32(values: np.ndarray, groups: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per group: the bits set in more than half of its members, as uint64. ``values`` are uint32 ordered by
    their ``groups`` (ascending indices into ``sizes``, the members of every group; empty groups give 0).

    Bit-sliced: the members are laid out by rank in a (depth, groups) array and added into vertical
    counters, 32 lanes per group, so each step is one vectorised operation over every group and bit at
    once; two groups share each uint64 word, halving the steps. Segment groups are small (a handful of
    features), where this beats a reduction.
    """
    count = len(sizes)
    width = count + count % 2  # an even count, so that rows view as uint64 pairs of groups
    depth = int(sizes.max())
    firsts = np.cumsum(sizes) - sizes
    lanes = np.zeros(depth * width, dtype=np.uint32)
    lanes[(np.arange(len(values)) - firsts[groups]) * width + groups] = values
    paired = lanes.reshape(depth, width).view(np.uint64)
    levels = max(1, depth.bit_length())
    counters = [np.zeros(width // 2, dtype=np.uint64) for _ in range(levels)]
    carry = np.empty(width // 2, dtype=np.uint64)
    overflow = np.empty(width // 2, dtype=np.uint64)
    for rank, row in enumerate(paired):
        carry[:] = row
        # After rank + 1 rows a counter holds at most rank + 1: the levels above stay clear.
        for level in counters[: (rank + 1).bit_length()]:
            # A ripple-carry add of one bit per lane: the carry out is carry AND the old counter bit.
            np.bitwise_and(carry, level, out=overflow)
            level ^= carry
            carry, overflow = overflow, carry
    # Lanes whose count exceeds half the group size: compare the counters with floor(size / 2), top bit first.
    half = np.zeros(width, dtype=np.uint32)
    half[:count] = sizes // 2
    greater = np.zeros(width // 2, dtype=np.uint64)
    equal = np.full(width // 2, 2**64 - 1, dtype=np.uint64)
    for bit in range(levels - 1, -1, -1):
        # All 32 lanes of a group take its threshold bit: 0 - 1 is 0xFFFFFFFF in uint32.
        threshold = np.negative((half >> np.uint32(bit)) & np.uint32(1)).view(np.uint64)
        greater |= equal & counters[bit] & ~threshold
        equal &= ~(counters[bit] ^ threshold)
    return greater.view(np.uint32)[:count].astype(np.uint64)


@dataclass(frozen=True)
class FingerprintBatch:
    """Fingerprints of a batch and what they were made from.

    ``errors[i]`` explains why document i could not be fingerprinted (its row is all zeros) or is None;
    ``empty[i]`` is true when document i had no features at all after normalisation. ``features`` are the
    ones :class:`Fingerprinter` keeps (a sampled fingerprint keeps only the sample).
    """

    fingerprints: np.ndarray
    features: FeatureBatch
    errors: tuple[str | None, ...]
    empty: np.ndarray
    _usable: list[int] = field(repr=False)
    _normalized_parts: list[CodePointBatch] = field(repr=False)

    @cached_property
    def normalized(self) -> list[str]:
        """The normalised text of each document ("" for one with an error); decoded on first use."""
        texts = [""] * len(self.errors)
        decoded = [text for part in self._normalized_parts for text in part.texts()]
        for index, text in zip(self._usable, decoded, strict=True):
            texts[index] = text
        return texts


class Fingerprinter:
    """Normalise, extract features and SimHash batches of texts; options are :class:`FingerprintSettings`.

    A fingerprint sampled from each segment's ``segment_sample / segments`` features of least identity only
    needs those, so :attr:`FingerprintBatch.features` holds just them and each document's ``keep_features`` of
    least identity (a bottom-k sketch taken from them needs k); otherwise it holds every feature.
    """

    def __init__(self, *, keep_features: int = 0, **options: Any) -> None:
        if keep_features < 0:
            raise ValueError(f"keep_features must be >= 0, got {keep_features}")
        self.settings = FingerprintSettings(**options)
        self.width = self.settings.width
        self.normalizer = Normalizer(self.settings.normalize)
        segmented = self.settings.segments > 1
        # A segmented fingerprint takes its bits from each feature's 64-bit hash, so wider digests are waste.
        digest_width = 64 if segmented else self.width
        sample = self.settings.segment_sample if segmented else 0
        self.extractor = FeatureExtractor(
            self._normalized_keys(self.settings.features),
            self.settings.hash,
            self.settings.seed,
            width=digest_width,
            least=keep_features if sample else 0,
            routes=self.settings.segments,
            least_per_route=sample // self.settings.segments,
        )

    @classmethod
    def from_settings(cls, settings: FingerprintSettings, keep_features: int = 0) -> Fingerprinter:
        return cls(keep_features=keep_features, **settings.model_dump())

    def fingerprint(self, texts: Sequence[str]) -> np.ndarray:
        """uint64 array (len(texts), width // 64)."""
        return self.fingerprint_batch(texts).fingerprints

    def fingerprint_batch(self, texts: Sequence[str | None]) -> FingerprintBatch:
        """Fingerprint every text; a text that cannot be used (not a string, too few characters) gets an error
        and an all-zero row, alone."""
        if isinstance(texts, str | bytes):
            raise TypeError("texts must be a sequence of texts, not a single text")
        usable, usable_texts, errors = self._accept(texts)
        parts: list[FeatureBatch] = []
        normalized: list[CodePointBatch] = []
        for first, last in _chunks(np.fromiter(map(len, usable_texts), dtype=np.int64, count=len(usable_texts))):
            try:
                normalized.append(self.normalizer.normalize_code_points(usable_texts[first:last]))
                parts.append(self.extractor.extract_code_points(normalized[-1]))
            except Exception:
                del normalized[len(parts) :]
                # Something in this chunk defeats the batch path: each document alone, so that only the
                # culprit fails.
                for index in range(first, last):
                    try:
                        normalized.append(self.normalizer.normalize_code_points(usable_texts[index : index + 1]))
                        parts.append(self.extractor.extract_code_points(normalized[-1]))
                    except Exception as exc:
                        del normalized[len(parts) :]
                        errors[usable[index]] = f"could not fingerprint this text: {type(exc).__name__}: {exc}"
                        normalized.append(CodePointBatch.from_texts([""]))
                        parts.append(self.extractor.extract_code_points(normalized[-1]))
        features = _place(_concatenate(parts, self.extractor.width), usable, len(errors))
        return FingerprintBatch(
            fingerprints=self._simhash(features),
            features=features,
            errors=tuple(errors),
            _usable=usable,
            _normalized_parts=normalized,
            empty=features.counts == 0,
        )

    def _simhash(self, features: FeatureBatch) -> np.ndarray:
        options = self.settings
        if options.segments == 1:
            return simhash_from_features(features)
        return segmented_simhash(
            features,
            self.width,
            options.segments,
            min_features=options.segment_min_features,
            sample=options.segment_sample,
        )

    def _accept(self, texts: Sequence[Any]) -> tuple[list[int], list[str], list[str | None]]:
        """Indices and texts (cut to ``max_text_chars``) of the usable documents, and an error per document."""
        limit = self.settings.max_text_chars
        texts = list(texts)
        if all(type(text) is str for text in texts):
            # The common case, without a Python step per document beyond the type check.
            if texts and max(map(len, texts)) > limit:
                texts = [text[:limit] for text in texts]
            return list(range(len(texts))), texts, [None] * len(texts)
        usable: list[int] = []
        usable_texts: list[str] = []
        errors: list[str | None] = []
        for index, text in enumerate(texts):
            error = None
            if isinstance(text, bytes):
                try:
                    text = text.decode("utf-8")
                except UnicodeDecodeError as exc:
                    error = f"text is not valid UTF-8: {exc.reason} at byte {exc.start}"
            elif not isinstance(text, str):
                error = f"text must be str, got {type(text).__name__}"
            errors.append(error)
            if error is None:
                usable.append(index)
                usable_texts.append(text[:limit])
        return usable, usable_texts, errors

    def _normalized_keys(self, features: FeatureSettings) -> FeatureSettings:
        """Vocabulary keys and excludes normalised like the texts, so ``Breaking`` matches ``BREAKING``."""
        if not features.vocabulary and not features.excludes:
            # Nothing to normalise: the normaliser's lookup tables (built on first use, ~1 s) wait for texts.
            return features
        keys = self.normalizer.normalize(list(features.vocabulary))
        vocabulary = dict(zip(keys, features.vocabulary.values(), strict=True))
        excludes = [token for token in self.normalizer.normalize(features.excludes) if token]
        vocabulary.pop("", None)
        return features.model_copy(update={"vocabulary": vocabulary, "excludes": excludes})


def _chunks(lengths: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive [first, last) runs of documents with at most ``_CHUNK_CODE_POINTS`` code points and
    ``MAX_DOCUMENTS`` documents (a longer document is a run of its own; always at least one run)."""
    ends = np.cumsum(lengths + 1)
    chunks: list[tuple[int, int]] = []
    first = 0
    while first < len(lengths) or not chunks:
        budget = (ends[first - 1] if first else 0) + _CHUNK_CODE_POINTS
        last = int(np.searchsorted(ends, budget, side="right"))
        last = min(max(last, first + 1), first + MAX_DOCUMENTS, len(lengths))
        chunks.append((first, last))
        first = last
    return chunks


def _concatenate(parts: list[FeatureBatch], width: int) -> FeatureBatch:
    if len(parts) == 1:
        return parts[0]
    offsets = [np.zeros(1, dtype=np.int64)]
    for part in parts:
        offsets.append(part.offsets[1:] + offsets[-1][-1])
    return FeatureBatch(
        hashes=np.concatenate([part.hashes for part in parts]),
        weights=np.concatenate([part.weights for part in parts]),
        offsets=np.concatenate(offsets),
        digests=np.concatenate([part.digests for part in parts]).reshape(-1, width // 64),
        identities=np.concatenate([part.identities for part in parts]),
    )


def _place(features: FeatureBatch, usable: list[int], total: int) -> FeatureBatch:
    """Spread the features of the usable documents over all ``total`` documents (the others get none)."""
    if len(usable) == total:
        return features
    counts = np.zeros(total, dtype=np.int64)
    counts[usable] = features.counts
    offsets = np.zeros(total + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return FeatureBatch(features.hashes, features.weights, offsets, features.digests, features.identities)
