"""Exact Jaccard over character shingles, and an all-pairs similarity join that finds, for every document, the
most similar EARLIER document above a threshold without comparing all pairs.

The join is PPJoin (prefix, length and positional filtering): order shingles rarest first; two sets with
Jaccard >= t must share a shingle within their first ``|x| - ceil(t|x|) + 1`` shingles. Candidates are the
sets sharing such a prefix shingle that pass the length and positional bounds; each is verified exactly by
counting common shingles. One numpy step per set; no pair of sets is compared unless it shares a rare shingle.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["EarlierMatch", "jaccard", "match_earlier", "shingles"]

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


def match_earlier(sets: Sequence[frozenset[str]], threshold: float) -> EarlierMatch:
    """For each set, its most similar earlier set with exact Jaccard >= ``threshold`` (0 < threshold <= 1)."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    n = len(sets)
    tokens, offsets = _ranked_tokens(sets)
    lengths = np.diff(offsets)
    left_parts, right_parts, score_parts = [], [], []
    for x, found, overlap in _ppjoin(tokens, offsets, lengths, threshold):
        score = overlap / (lengths[x] + lengths[found] - overlap)
        keep = score >= threshold - 1e-12
        earlier = np.minimum(found[keep], x)
        later = np.maximum(found[keep], x)
        left_parts.append(earlier)
        right_parts.append(later)
        score_parts.append(score[keep])
    similarity = np.zeros(n, dtype=np.float64)
    position = np.full(n, -1, dtype=np.int64)
    if not left_parts:
        return EarlierMatch(similarity, position)
    left, right, scores = np.concatenate(left_parts), np.concatenate(right_parts), np.concatenate(score_parts)
    # Best per later document: sort by (later, -score, earlier) and take the first of each run.
    order = np.lexsort((left, -scores, right))
    left, right, scores = left[order], right[order], scores[order]
    first = np.ones(right.size, dtype=bool)
    first[1:] = right[1:] != right[:-1]
    similarity[right[first]] = scores[first]
    position[right[first]] = left[first]
    return EarlierMatch(similarity, position)


def _ranked_tokens(sets: Sequence[frozenset[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Each set as ascending token ranks (rarest shingle = rank 0), concatenated, with CSR offsets."""
    vocabulary: dict[str, int] = {}
    flat = np.fromiter(
        (vocabulary.setdefault(shingle, len(vocabulary)) for each in sets for shingle in each),
        dtype=np.int64,
    )
    offsets = np.zeros(len(sets) + 1, dtype=np.int64)
    np.cumsum([len(each) for each in sets], out=offsets[1:])
    frequency = np.bincount(flat, minlength=len(vocabulary))
    rank = np.empty(len(vocabulary), dtype=np.int64)
    rank[np.lexsort((np.arange(len(vocabulary)), frequency))] = np.arange(len(vocabulary))
    tokens = rank[flat]
    owner = np.repeat(np.arange(len(sets), dtype=np.int64), np.diff(offsets))
    tokens = tokens[np.lexsort((tokens, owner))]
    return tokens, offsets


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
        entry_token[order], entry_owner[order], entry_position[order], entry_rank[order]
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
            found[fits], found_position[fits], probe_position[fits], found_size[fits]
        )
        if found.size == 0:
            continue
        # Positional bound: k shared tokens before this hit, this one, and at most the shorter remainder.
        order = np.lexsort((probe_position, found))
        found, found_position, probe_position, found_size = (
            found[order], found_position[order], probe_position[order], found_size[order]
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
