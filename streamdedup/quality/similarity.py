"""Exact Jaccard over character shingles, and an all-pairs similarity join that finds, for every document, the
most similar EARLIER document above a threshold without comparing all pairs.

The join is PPJoin (prefix, length and positional filtering): order shingles rarest first; two sets with
Jaccard >= t must share a shingle within their first ``|x| - ceil(t|x|) + 1`` shingles. Candidates are the
sets sharing such a prefix shingle that pass the length and positional bounds; each is verified exactly by
counting common shingles. One numpy step per set; no pair of sets is compared unless it shares a rare shingle.

:class:`TokenSets` holds the sets as integer tokens; :meth:`TokenSets.shingled` builds them from whole batches
of texts with numpy (equal, set for set, to :func:`shingles`), and :meth:`TokenSets.subset` lets one
tokenisation serve joins over many subsets of the same texts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["EarlierMatch", "SimilarPairs", "TokenSets", "jaccard", "match_earlier", "shingles", "similar_pairs"]

SHINGLE_SIZE = 3


def shingles(text: str, size: int = SHINGLE_SIZE) -> frozenset[str]:
    """The set of ``size``-grams over code points; a non-empty text shorter than ``size`` is its own shingle."""
    if len(text) < size:
        return frozenset((text,)) if text else frozenset()
    return frozenset(text[start : start + size] for start in range(len(text) - size + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Exact Jaccard similarity; an empty set resembles nothing (0.0), as in :func:`match_earlier`."""
    if not a or not b:
        return 0.0
    common = len(a & b)
    return common / (len(a) + len(b) - common)


@dataclass(frozen=True, slots=True)
class EarlierMatch:
    """Per document: the highest Jaccard to any earlier document when it is >= the threshold (else 0.0), and
    the position of that earlier document (the earliest one among ties; -1 when none reaches the threshold)."""

    similarity: np.ndarray  # float64 (n,)
    position: np.ndarray  # int64 (n,)


@dataclass(frozen=True, slots=True)
class SimilarPairs:
    """Every pair of sets with exact Jaccard >= the threshold, by (later, earlier) position."""

    earlier: np.ndarray  # int64 (pairs,)
    later: np.ndarray  # int64 (pairs,)
    similarity: np.ndarray  # float64 (pairs,)


@dataclass(frozen=True, slots=True)
class TokenSets:
    """Sets of integer tokens in CSR form: set i is ``tokens[offsets[i]:offsets[i + 1]]``, ascending.

    Token order is the join's global order: any fixed order gives the same pairs; rarest first (as both
    constructors rank) makes the prefixes most selective."""

    tokens: np.ndarray  # int64
    offsets: np.ndarray  # int64 (sets + 1,)

    def __len__(self) -> int:
        return self.offsets.size - 1

    @classmethod
    def of(cls, sets: Sequence[frozenset[str]]) -> TokenSets:
        """Sets of shingles (any hashable strings) as ranked tokens."""
        vocabulary: dict[str, int] = {}
        flat = np.fromiter(
            (vocabulary.setdefault(shingle, len(vocabulary)) for each in sets for shingle in each),
            dtype=np.int64,
        )
        owner = np.repeat(np.arange(len(sets), dtype=np.int64), [len(each) for each in sets])
        return cls._ranked(flat, owner, len(sets))

    @classmethod
    def shingled(cls, texts: Sequence[str], size: int = SHINGLE_SIZE) -> TokenSets:
        """``shingles(text, size)`` of every text, computed over the whole batch at once: code points become
        dense ids 1..A (0 pads a text shorter than ``size`` on the left, so it stays its own shingle and
        equals no real one) and a shingle is its ids as one base-(A + 1) integer."""
        lengths = np.fromiter((len(text) for text in texts), dtype=np.int64, count=len(texts))
        code_points = np.frombuffer("".join(texts).encode("utf-32-le"), dtype=np.uint32)
        lookup = np.zeros(0x110000, dtype=np.int64)
        lookup[code_points] = 1
        alphabet = np.flatnonzero(lookup)
        lookup[alphabet] = np.arange(1, alphabet.size + 1)
        base = alphabet.size + 1
        if base**size >= 2**63:  # too many distinct code points for one int64 per shingle
            return cls.of([shingles(text, size) for text in texts])
        padding = np.where(lengths > 0, np.maximum(size - lengths, 0), 0)
        starts = np.cumsum(lengths) - lengths
        padded = np.insert(lookup[code_points], np.repeat(starts, padding), 0)
        padded_starts = starts + np.cumsum(padding) - padding
        count = max(padded.size - size + 1, 0)
        value = np.zeros(count, dtype=np.int64)
        for offset in range(size):
            value = value * base + padded[offset : offset + count]
        per_text = np.where(lengths > 0, lengths + padding - size + 1, 0)
        flat = value[_spans(padded_starts, per_text)]
        owner = np.repeat(np.arange(len(texts), dtype=np.int64), per_text)
        return cls._ranked(flat, owner, len(texts))

    @classmethod
    def _ranked(cls, flat: np.ndarray, owner: np.ndarray, n: int) -> TokenSets:
        """(token, owner) pairs (owner ascending) as rarest-first ranks, each set's duplicates dropped: flat sorts
        of one int64 key (owner * vocabulary + token), several times faster than two-key lexsorts."""
        token, size = _dense(flat)
        size = max(size, 1)
        key = np.sort(owner * size + token)
        distinct = np.ones(key.size, dtype=bool)
        distinct[1:] = key[1:] != key[:-1]
        key = key[distinct]  # per set: distinct tokens, ascending
        owner, token = key // size, key % size
        frequency = np.bincount(token, minlength=size)
        rank = np.empty(size, dtype=np.int64)
        rank[np.lexsort((np.arange(size), frequency))] = np.arange(size)
        key = np.sort(owner * size + rank[token])
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(owner, minlength=n), out=offsets[1:])
        return cls(key % size, offsets)

    def first_identical(self) -> np.ndarray:
        """Per set, the position of the first set equal to it (itself when it is the first); an empty set
        resembles nothing, so each empty set is its own."""
        first: dict[bytes, int] = {}
        lengths = np.diff(self.offsets).tolist()
        bounds = self.offsets.tolist()
        return np.fromiter(
            (
                first.setdefault(self.tokens[bounds[i] : bounds[i + 1]].tobytes(), i) if lengths[i] else i
                for i in range(len(lengths))
            ),
            dtype=np.int64,
            count=len(lengths),
        )

    def subset(self, positions: np.ndarray) -> TokenSets:
        """The sets at ``positions`` (in that order), same tokens."""
        positions = np.asarray(positions, dtype=np.int64)
        lengths = np.diff(self.offsets)[positions]
        offsets = np.zeros(positions.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return TokenSets(self.tokens[_spans(self.offsets[:-1][positions], lengths)], offsets)


def similar_pairs(sets: Sequence[frozenset[str]] | TokenSets, threshold: float) -> SimilarPairs:
    """Every pair of sets with exact Jaccard >= ``threshold`` (0 < threshold <= 1)."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    token_sets = sets if isinstance(sets, TokenSets) else TokenSets.of(sets)
    lengths = np.diff(token_sets.offsets)
    left_parts, right_parts, score_parts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
    for x, found, overlap in _ppjoin(token_sets.tokens, token_sets.offsets, lengths, threshold):
        score = overlap / (lengths[x] + lengths[found] - overlap)
        keep = score >= threshold - 1e-12
        left_parts.append(np.minimum(found[keep], x))
        right_parts.append(np.maximum(found[keep], x))
        score_parts.append(score[keep])
    left, right, scores = np.concatenate(left_parts), np.concatenate(right_parts), np.concatenate(score_parts)
    order = np.lexsort((left, right))
    return SimilarPairs(left[order], right[order], scores[order])


def match_earlier(sets: Sequence[frozenset[str]] | TokenSets, threshold: float) -> EarlierMatch:
    """For each set, its most similar earlier set with exact Jaccard >= ``threshold`` (0 < threshold <= 1).

    A repeat of an earlier set matches that set's first occurrence with 1.0; the join runs over first
    occurrences only, as a set's repeats would add nothing but all their pairs (texts repeated a thousand times
    are common)."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    token_sets = sets if isinstance(sets, TokenSets) else TokenSets.of(sets)
    n = len(token_sets)
    similarity = np.zeros(n, dtype=np.float64)
    position = np.full(n, -1, dtype=np.int64)
    group = token_sets.first_identical()
    firsts = np.flatnonzero(group == np.arange(n))
    repeats = np.flatnonzero(group != np.arange(n))
    similarity[repeats], position[repeats] = 1.0, group[repeats]
    pairs = similar_pairs(token_sets.subset(firsts), threshold)
    # Best per later set: sort by (later, -score, earlier) and take the first of each run.
    order = np.lexsort((pairs.earlier, -pairs.similarity, pairs.later))
    left, right, scores = pairs.earlier[order], pairs.later[order], pairs.similarity[order]
    first = np.ones(right.size, dtype=bool)
    first[1:] = right[1:] != right[:-1]
    similarity[firsts[right[first]]] = scores[first]
    position[firsts[right[first]]] = firsts[left[first]]
    return EarlierMatch(similarity, position)


def _dense(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Each value as its rank among the distinct values (0..count-1), and that count. One argsort: faster
    than ``np.unique(..., return_inverse=True)`` on tens of millions of values."""
    order = np.argsort(values)
    ordered = values[order]
    new = np.ones(ordered.size, dtype=bool)
    new[1:] = ordered[1:] != ordered[:-1]
    dense = np.empty(values.size, dtype=np.int64)
    dense[order] = np.cumsum(new) - 1
    return dense, int(new.sum())


def _spans(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated ranges [start, start + count) as one index array."""
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(starts, counts) + within


def _ppjoin(
    tokens: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, threshold: float
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """PPJoin (Xiao et al. 2008): sets visited shortest first; each probes the index of the sets visited before
    it with its probe prefix; the index holds only each set's shorter index prefix; candidates are pruned by
    the positional bound before exact verification. Yields (set, candidate sets, exact overlaps) per set."""
    n = lengths.size
    visit = np.lexsort((np.arange(n), lengths))
    visit_rank = np.empty(n, dtype=np.int64)
    visit_rank[visit] = np.arange(n)
    probe_prefix = np.where(lengths > 0, lengths - np.ceil(threshold * lengths - 1e-9).astype(np.int64) + 1, 0)
    index_prefix = np.where(
        lengths > 0, lengths - np.ceil(2 * threshold / (1 + threshold) * lengths - 1e-9).astype(np.int64) + 1, 0
    )
    # The whole index, built up front: postings sorted by (token, visit rank), so the postings visible to the
    # set visited r-th are, for each token, the run's entries with visit rank < r (a prefix of the run).
    entry = _spans(offsets[:-1], index_prefix)
    entry_owner = np.repeat(np.arange(n, dtype=np.int64), index_prefix)
    entry_position = entry - offsets[:-1][entry_owner]
    entry_token = tokens[entry]
    entry_rank = visit_rank[entry_owner]
    order = np.lexsort((entry_rank, entry_token))
    entry_token, entry_owner, entry_position, entry_rank = (
        entry_token[order],
        entry_owner[order],
        entry_position[order],
        entry_rank[order],
    )
    entry_key = entry_token * n + entry_rank  # ascending
    member = np.zeros(int(tokens.max()) + 1 if tokens.size else 1, dtype=bool)
    for rank, x in enumerate(visit.tolist()):
        size = int(lengths[x])
        if size == 0 or rank == 0:
            continue
        probe = tokens[offsets[x] : offsets[x] + probe_prefix[x]]
        begin = np.searchsorted(entry_key, probe * n)
        end = np.searchsorted(entry_key, probe * n + rank)
        hits = _spans(begin, end - begin)
        if hits.size == 0:
            continue
        probe_position = np.repeat(np.arange(probe.size, dtype=np.int64), end - begin)
        found, found_position = entry_owner[hits], entry_position[hits]
        found_size = lengths[found]
        fits = found_size >= threshold * size - 1e-9
        found, found_position, probe_position, found_size = (
            found[fits],
            found_position[fits],
            probe_position[fits],
            found_size[fits],
        )
        if found.size == 0:
            continue
        # Positional bound: k shared tokens before this hit, this one, and at most the shorter remainder.
        order = np.lexsort((probe_position, found))
        found, found_position, probe_position, found_size = (
            found[order],
            found_position[order],
            probe_position[order],
            found_size[order],
        )
        run_start = np.ones(found.size, dtype=bool)
        run_start[1:] = found[1:] != found[:-1]
        starts = np.flatnonzero(run_start)
        shared_before = np.arange(found.size) - np.repeat(starts, np.diff(np.append(starts, found.size)))
        bound = shared_before + 1 + np.minimum(size - probe_position - 1, found_size - found_position - 1)
        needed = np.ceil(threshold / (1 + threshold) * (size + found_size) - 1e-9)
        alive = np.minimum.reduceat(bound - needed, starts) >= 0
        candidates = found[starts[alive]]
        if candidates.size == 0:
            continue
        # Exact overlap: the candidates' tokens looked up in a membership mask of x's tokens.
        own = tokens[offsets[x] : offsets[x] + size]
        member[own] = True
        spans = _spans(offsets[:-1][candidates], lengths[candidates])
        pair = np.repeat(np.arange(candidates.size, dtype=np.int64), lengths[candidates])
        overlap = np.bincount(pair[member[tokens[spans]]], minlength=candidates.size)
        member[own] = False
        yield x, candidates, overlap
