"""Features of normalised texts, extracted and hashed for a whole batch at once with numpy.

A feature is identified by its text: a word token, word n-grams joined by one space, a character n-gram
over code points, or (automatically) a character n-gram of a script written without spaces (Chinese,
Japanese, Thai, ...). A document with no word character at all (emoji only, symbols only) is represented
by the character n-grams of its non-space code points, so it still gets a meaningful fingerprint.

Hashing never leaves numpy on the default path: a polynomial hash of the code points (uint64 wrap-around)
taken from prefix sums over the whole batch, so every span is hashed in O(1) and word n-gram hashes are
composed from their tokens'; murmur3's fmix64 seeded by ``seed`` finishes it. Within a document a feature
is identified by the top 44 bits of that hash (two distinct features of one document collide with
probability about features**2 / 2**45), which lets one plain ``np.sort`` of (document, identity) keys find
each document's distinct features and their counts. The ``fast`` feature hash is fmix64 of the identity;
``md5`` (MD5 of the UTF-8 feature text, big-endian, as the Erlang seed) and ``shake256`` (an XOF for any
width, as htm.core) call :mod:`hashlib` once per distinct feature of the batch, several times slower.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import numpy as np

from .normalize import NOSPACE, PUNCTUATION, SYMBOL, WORD, CodePointBatch
from .settings import FeatureSettings

__all__ = [
    "IDENTITY_BITS",
    "MAX_DOCUMENTS",
    "MAX_ROUTES",
    "FeatureBatch",
    "FeatureExtractor",
    "HashName",
    "among_first",
    "mix64",
    "route_of",
]

HashName = Literal["fast", "md5", "shake256"]

IDENTITY_BITS = 44
MAX_DOCUMENTS = (1 << (64 - IDENTITY_BITS)) - 1
"""Most documents one extraction call takes (the document index shares a uint64 sort key with the identity,
and one more index marks windows that straddle two documents)."""

_IDENTITY_SHIFT = np.uint64(64 - IDENTITY_BITS)
_IDENTITY_MASK = np.uint64((1 << IDENTITY_BITS) - 1)
_IDENTITY_LIMIT = np.uint64(1 << IDENTITY_BITS)
_IDENTITY_SHIFT_ROUTE = np.uint64(IDENTITY_BITS)
MAX_ROUTES = 1 << (64 - IDENTITY_BITS)
_KEY_DOCUMENT_SHIFT = np.uint64(IDENTITY_BITS)  # a (document, identity) key: the document above the identity
# With ``least``, a document's occurrences are first cut to an identity bound expected to leave this many times
# ``least`` of them: enough that repeated features rarely leave fewer than ``least`` distinct ones.
_OVERSAMPLE = 4.0
# The same for ``least_per_route``, higher because every one of the routes must keep enough, and features repeat
# (a 10-20 kB text has distinct features for ~40 % of its code points): expecting 42 occurrences where 3 features
# are wanted leaves ~17 distinct, and a route falls short with probability ~1e-5 (one 32-route text in ~4,000).
_ROUTE_OVERSAMPLE = 14.0
_SPACE_CODE_POINT = np.uint64(0x20)
# Odd multiplier of the polynomial hash, so it is invertible modulo 2**64.
_BASE = 0x9E3779B97F4A7C15
_BASE_INVERSE = pow(_BASE, -1, 2**64)
_BASE_U64 = np.uint64(_BASE)
_LENGTH_MIX = np.uint64(0xD6E8FEB86659FD93)
_HASH_MIX = np.uint64(0x8EBC6AF09C88C6E3)
_WORD_MIX = np.uint64(0xA0761D6478BD642F)
_FMIX_1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX_2 = np.uint64(0xC4CEB9FE1A85EC53)
_SHIFT = np.uint64(33)


def route_of(identities: np.ndarray, routes: int) -> np.ndarray:
    """Route (0 .. routes - 1, as intp) of each identity: its place in ``routes`` equal ranges of the identity
    space.

    Ranges keep identity order, so a document's features (ascending identities) come grouped by route.
    """
    routed = identities * np.uint64(routes)
    routed >>= _IDENTITY_SHIFT_ROUTE
    # Below 2**20, so the same words read as intp: no copy.
    return routed.view(np.intp)


def _within_route(identities: np.ndarray, routes: int) -> np.ndarray:
    """Each identity's place within its route, scaled to the identity range (ascending within a route)."""
    return (identities * np.uint64(routes)) & _IDENTITY_MASK


def mix64(values: np.ndarray) -> np.ndarray:
    """murmur3 fmix64 over a uint64 array (a bijection with full avalanche)."""
    x = values ^ (values >> _SHIFT)
    x *= _FMIX_1
    x ^= x >> _SHIFT
    x *= _FMIX_2
    x ^= x >> _SHIFT
    return x


@dataclass(frozen=True)
class FeatureBatch:
    """Distinct features per document: document i owns ``hashes[offsets[i]:offsets[i + 1]]``.

    ``digests`` holds each feature's full-width hash as uint64 words (``digests[:, 0] == hashes``), in the
    fingerprint bit order (bit i is bit 63 - i % 64 of word i // 64). ``identities`` are the features'
    seeded ``IDENTITY_BITS``-bit identity hashes, ascending within each document: a document's first k
    features are its bottom-k sample without another sort, and its features of each route (:func:`route_of`)
    are contiguous, least identity first.
    """

    hashes: np.ndarray
    weights: np.ndarray
    offsets: np.ndarray
    digests: np.ndarray = field(repr=False)
    identities: np.ndarray = field(repr=False)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def counts(self) -> np.ndarray:
        """Number of distinct features of each document."""
        return np.diff(self.offsets)

    @property
    def documents(self) -> np.ndarray:
        """Document index of each feature."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.counts)


class _Powers:
    """BASE**i and BASE**-i modulo 2**64, grown on demand and shared (the tables only ever get longer)."""

    _lock = threading.Lock()
    _tables = (np.ones(1, dtype=np.uint64), np.ones(1, dtype=np.uint64))

    @classmethod
    def get(cls, size: int) -> tuple[np.ndarray, np.ndarray]:
        powers, inverse = cls._tables
        if len(powers) < size:
            with cls._lock:
                powers, inverse = cls._tables
                if len(powers) < size:
                    size = max(size, 2 * len(powers))
                    powers, inverse = _power_table(_BASE, size), _power_table(_BASE_INVERSE, size)
                    cls._tables = (powers, inverse)
        return powers, inverse


def _power_table(base: int, size: int) -> np.ndarray:
    powers = np.full(size, base, dtype=np.uint64)
    powers[0] = 1
    np.cumprod(powers, out=powers)
    powers.flags.writeable = False
    return powers


class _PolynomialText:
    """Code points with prefix sums of their polynomial hash (built on first use), for O(1) span hashes."""

    def __init__(self, code_points: np.ndarray) -> None:
        self.code_points = code_points
        self.powers, self.inverse_powers = _Powers.get(len(code_points) + 1)

    @cached_property
    def prefix(self) -> np.ndarray:
        size = len(self.code_points) + 1
        prefix = np.empty(size, dtype=np.uint64)
        prefix[0] = 0
        # In place, in the one array: a fresh temporary per step costs more than the arithmetic.
        terms = prefix[1:]
        terms[:] = self.code_points
        terms *= self.powers[: size - 1]
        np.cumsum(terms, out=terms)
        return prefix

    def span_hashes(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """sum(code_point[j] * BASE**(j - start)) over each span [start, end), modulo 2**64."""
        return (self.prefix[ends] - self.prefix[starts]) * self.inverse_powers[starts]

    def decode(self, start: int, stop: int) -> str:
        return self.code_points[start:stop].astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")


@dataclass(frozen=True)
class _Spans:
    """Feature occurrences that are contiguous spans [start, end) of ``source``'s code points."""

    source: _PolynomialText
    starts: np.ndarray
    ends: np.ndarray

    def texts(self, rows: np.ndarray) -> list[str]:
        decode = self.source.decode
        return [decode(a, b) for a, b in zip(self.starts[rows].tolist(), self.ends[rows].tolist(), strict=True)]


@dataclass(frozen=True)
class _TokenGrams:
    """Word n-gram occurrences: ``sizes[r]`` tokens from token ``firsts[r]`` of ``tokens``, joined by a space."""

    tokens: _Spans
    firsts: np.ndarray
    sizes: np.ndarray

    def texts(self, rows: np.ndarray) -> list[str]:
        tokens = self.tokens
        return [
            " ".join(tokens.texts(np.arange(first, first + size)))
            for first, size in zip(self.firsts[rows].tolist(), self.sizes[rows].tolist(), strict=True)
        ]


@dataclass(frozen=True)
class _Windows:
    """Every ``size``-long window of ``source``'s code points, the window at row r starting at code point r."""

    source: _PolynomialText
    size: int

    def texts(self, rows: np.ndarray) -> list[str]:
        decode = self.source.decode
        return [decode(start, start + self.size) for start in rows.tolist()]


_Group = _Spans | _TokenGrams | _Windows


def _class_runs(classes: np.ndarray, wanted: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of the runs of code points of class ``wanted``."""
    inside = classes == wanted
    edges = np.flatnonzero(inside[1:] != inside[:-1]) + 1
    if len(inside) and inside[0]:
        edges = np.concatenate(([0], edges))
    if len(edges) % 2:
        edges = np.append(edges, len(inside))
    return edges[::2], edges[1::2]


def _owners(positions: np.ndarray, document_starts: np.ndarray) -> np.ndarray:
    """Document of each of the (ascending) positions: a search per document, not per position."""
    bounds = np.empty(len(document_starts) + 1, dtype=np.int64)
    bounds[0], bounds[-1] = 0, len(positions)
    bounds[1:-1] = np.searchsorted(positions, document_starts[1:])
    return np.repeat(np.arange(len(document_starts), dtype=np.int64), np.diff(bounds))


def _fixed_windows(
    code_points: np.ndarray, inside: np.ndarray, size: int, short_starts: np.ndarray, short_lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray | np.int64]:
    """Polynomial hash, start and length (one for all when they are equal) of every ``size``-long window of
    code points that are all ``inside``, in order, then of each given span shorter than ``size``.

    Hashed by Horner's rule over shifted slices of the whole batch: every step reads memory in order, where
    span hashes from prefix sums gather three times per window.
    """
    count = max(len(code_points) - size + 1, 0)
    whole = inside[:count].copy()
    for offset in range(1, size):
        whole &= inside[offset : offset + count]
    starts = np.flatnonzero(whole)
    # Few windows (a script that is a small part of the batch): hash just those, gathering.
    few = 4 * len(starts) < count

    hashes = _window_hashes(code_points, size, starts) if few else _window_hashes(code_points, size)[starts]
    if not len(short_starts):
        return hashes, starts, np.int64(size)
    return (
        np.concatenate([hashes, _short_hashes(code_points, short_starts, short_lengths, size)]),
        np.concatenate([starts, short_starts]),
        np.concatenate([np.full(len(starts), size, dtype=np.int64), short_lengths]),
    )


def _short_hashes(code_points: np.ndarray, starts: np.ndarray, lengths: np.ndarray, size: int) -> np.ndarray:
    """Polynomial hash of spans shorter than ``size``, by Horner's rule over gathers (they are few)."""
    powers, _ = _Powers.get(size)
    hashes = np.zeros(len(starts), dtype=np.uint64)
    for offset in range(size - 1):
        present = offset < lengths
        terms = code_points[starts + offset * present].astype(np.uint64) * powers[offset]
        hashes += np.where(present, terms, np.uint64(0))
    return hashes


def _window_hashes(code_points: np.ndarray, size: int, starts: np.ndarray | None = None) -> np.ndarray:
    """Polynomial hash of the ``size``-long window starting at each of ``starts`` (gathered), or by default at
    every code point that has one (shifted slices, read in order)."""
    if starts is None:
        count = max(len(code_points) - size + 1, 0)

        def column(offset: int) -> np.ndarray:
            return code_points[offset : offset + count]

    else:

        def column(offset: int) -> np.ndarray:
            return code_points[starts + offset]

    hashes = column(size - 1).astype(np.uint64)
    for offset in range(size - 2, -1, -1):
        hashes *= _BASE_U64
        hashes += column(offset)
    return hashes


def _windows(starts: np.ndarray, ends: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every ``size``-long window inside each segment [start, end): (window starts, window ends, segment).

    A non-empty segment shorter than ``size`` gives one window covering it.
    """
    lengths = ends - starts
    counts = np.maximum(lengths - size + 1, 0)
    counts[(lengths > 0) & (lengths < size)] = 1
    segment = np.repeat(np.arange(len(starts), dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    window_starts = starts[segment] + (np.arange(len(segment), dtype=np.int64) - first[segment])
    window_ends = np.minimum(window_starts + size, ends[segment])
    return window_starts, window_ends, segment


class FeatureExtractor:
    """Turns normalised texts into a :class:`FeatureBatch` of hashed, weighted, filtered features.

    With ``least`` > 0 each document keeps its ``least`` distinct features of least identity (a bottom-k
    sketch); with ``least_per_route`` > 0, also the ``least_per_route`` of least identity among its features of
    each of ``routes`` routes (:func:`route_of`; a segmented fingerprint's sample). With either, a document
    keeps just those, found without sorting all of its features; with neither, it keeps every feature.
    """

    def __init__(
        self,
        settings: FeatureSettings | None = None,
        hash_name: HashName = "fast",
        seed: int = 0,
        *,
        width: int = 64,
        least: int = 0,
        routes: int = 1,
        least_per_route: int = 0,
    ) -> None:
        if hash_name not in ("fast", "md5", "shake256"):
            raise ValueError(f"hash must be fast, md5 or shake256, got {hash_name!r}")
        if width < 64 or width % 64:
            raise ValueError(f"width must be a positive multiple of 64, got {width}")
        if not 0 <= seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {seed}")
        if least < 0 or least_per_route < 0:
            raise ValueError(f"least and least_per_route must be >= 0, got {least} and {least_per_route}")
        if not 1 <= routes <= MAX_ROUTES:
            raise ValueError(f"routes must be between 1 and {MAX_ROUTES}, got {routes}")
        self.settings = settings or FeatureSettings()
        self.least = least
        self.routes = routes
        self.least_per_route = least_per_route
        self.hash_name = hash_name
        self.seed = seed
        self.width = width
        self._seed_key = mix64(np.array([seed ^ 0x5851F42D4C957F2D], dtype=np.uint64))[0]
        self._excluded = np.unique(self._identities(CodePointBatch.from_texts(self.settings.excludes)))
        vocabulary = self.settings.vocabulary
        identities = self._identities(CodePointBatch.from_texts(list(vocabulary)))
        order = np.argsort(identities, kind="stable")
        self._vocabulary_keys = identities[order]
        self._vocabulary_weights = np.array(list(vocabulary.values()), dtype=np.float64)[order]

    def extract(self, texts: Sequence[str]) -> FeatureBatch:
        """Features of each text (already normalised), in one vectorised pass over the batch."""
        return self.extract_code_points(CodePointBatch.from_texts(texts))

    def hash_features(self, texts: Sequence[str]) -> np.ndarray:
        """The 64-bit hash (first digest word) this extractor gives features with these texts."""
        batch = CodePointBatch.from_texts(texts)
        identity = self._identities(batch)
        spans = _Spans(_PolynomialText(batch.code_points), batch.starts, batch.starts + batch.lengths)
        return self._digests(identity, np.arange(len(batch)), [spans], [len(batch)])[:, 0].copy()

    def extract_code_points(self, batch: CodePointBatch) -> FeatureBatch:
        """Features of each document of a :class:`CodePointBatch` (what the normaliser produces)."""
        if len(batch) > MAX_DOCUMENTS:
            raise ValueError(f"at most {MAX_DOCUMENTS} documents per extraction, got {len(batch)}")
        classes = batch.classes
        document_starts = batch.starts
        polynomial: list[_PolynomialText] = []

        def original() -> _PolynomialText:
            """Prefix hashes of the batch's own code points, built on first use: only word features, excludes
            and scripts without spaces read them."""
            if not polynomial:
                polynomial.append(_PolynomialText(batch.code_points))
            return polynomial[0]

        groups: list[_Group] = []
        identities: list[np.ndarray] = []
        owner_lists: list[np.ndarray] = []

        def add(group: _Group, hashes: np.ndarray, lengths: np.ndarray | np.int64, owners: np.ndarray) -> None:
            groups.append(group)
            identities.append(self._identity(hashes, lengths))
            owner_lists.append(owners)

        word_sizes = self.settings.word_ngrams
        if word_sizes or len(self._excluded):
            # Words are the runs of WORD code points (the last code point is always NUL, which closes every run).
            token_starts, token_ends = _class_runs(classes, WORD)
            text = original()
            token_hashes = text.span_hashes(token_starts, token_ends)
            token_lengths = token_ends - token_starts
            if len(self._excluded):
                # An excluded token is removed before n-grams are formed, as if it were not in the text.
                kept = ~np.isin(self._identity(token_hashes, token_lengths), self._excluded)
                token_starts, token_ends = token_starts[kept], token_ends[kept]
                token_hashes, token_lengths = token_hashes[kept], token_lengths[kept]
            token_documents = _owners(token_starts, document_starts)
            wordy = np.bincount(token_documents, minlength=len(batch)) > 0
        else:
            # Every document spans at least its closing NUL, so no reduced segment is empty.
            wordy = np.logical_or.reduceat(classes == WORD, document_starts)
        for size in word_sizes:
            tokens = _Spans(text, token_starts, token_ends)
            if size == 1:
                add(tokens, token_hashes, token_lengths, token_documents)
                continue
            firsts, gram_sizes, hashes, gram_lengths = _word_grams(
                token_documents, token_hashes, token_lengths, text.powers, size, short=size == word_sizes[0]
            )
            add(_TokenGrams(tokens, firsts, gram_sizes), hashes, gram_lengths, token_documents[firsts])

        nospace_starts, nospace_ends = _class_runs(classes, NOSPACE)
        if len(nospace_starts):
            size = self.settings.cjk_char_ngram
            run_lengths = nospace_ends - nospace_starts
            short = np.flatnonzero(run_lengths < size)
            hashes, starts, lengths = _fixed_windows(
                batch.code_points, classes == NOSPACE, size, nospace_starts[short], run_lengths[short]
            )
            full = len(starts) - len(short)
            owners = np.concatenate([_owners(starts[:full], document_starts), _owners(starts[full:], document_starts)])
            wordy[owners] = True
            add(_Spans(original(), starts, starts + lengths), hashes, lengths, owners)

        char_sizes = self.settings.char_ngrams
        if char_sizes:
            # Character n-grams read the text as it reads: artefacts gone, blanks collapsed. Without spaces,
            # grams run across word boundaries, so merged or split words ("dall altra", "dallaltra") give the
            # same grams.
            compacted = batch.compacted if self.settings.char_ngram_spaces else batch.solid
            reading = original() if compacted is batch else _PolynomialText(compacted.code_points)
            lengths = compacted.lengths
            # Every window of the batch is hashed, and the ones that straddle two documents belong to the
            # document past the last, whose keys are dropped: cheaper than finding and gathering the others.
            # Each document is followed by one boundary: of the windows that start in it or on that boundary,
            # the first ``fitting`` fit in it and the others straddle.
            run_owners = np.full(2 * len(batch), len(batch), dtype=np.int64)
            run_owners[0::2] = np.arange(len(batch))
            for size in char_sizes:
                fitting = np.maximum(lengths - (size - 1), 0)
                runs = np.empty(2 * len(batch), dtype=np.int64)
                runs[0::2] = fitting
                runs[1::2] = lengths + 1 - fitting
                hashes = _window_hashes(compacted.code_points, size)
                add(_Windows(reading, size), hashes, np.int64(size), np.repeat(run_owners, runs)[: len(hashes)])
                # Only the first size gives a document shorter than it one window covering it.
                short = np.flatnonzero((lengths > 0) & (lengths < size) & (size == char_sizes[0]))
                if len(short):
                    starts, short_lengths = compacted.starts[short], lengths[short]
                    hashes = _short_hashes(compacted.code_points, starts, short_lengths, size)
                    add(_Spans(reading, starts, starts + short_lengths), hashes, short_lengths, short)

        without_words = np.flatnonzero(~wordy & (batch.lengths > 0))
        if len(without_words):
            self._add_symbol_grams(batch, without_words, add)
        return self._collect(batch.lengths, groups, identities, owner_lists)

    def _add_symbol_grams(
        self,
        batch: CodePointBatch,
        documents: np.ndarray,
        add: Callable[[_Group, np.ndarray, np.ndarray, np.ndarray], None],
    ) -> None:
        """Character n-grams of the non-space code points of documents without any word character."""
        lengths = batch.lengths[documents]
        owners = np.repeat(documents, lengths)
        first = np.cumsum(lengths) - lengths
        positions = np.repeat(batch.starts[documents] - first, lengths) + np.arange(len(owners))
        kind = batch.classes[positions]
        solid = kind == SYMBOL
        if not batch.collapse:
            solid |= kind == PUNCTUATION
        positions, owners = positions[solid], owners[solid]
        if not len(positions):
            return
        compact = _PolynomialText(batch.code_points[positions])
        segment_starts = np.flatnonzero(np.diff(owners, prepend=-1))
        segment_ends = np.append(segment_starts[1:], len(positions))
        starts, ends, segment = _windows(segment_starts, segment_ends, self.settings.cjk_char_ngram)
        add(
            _Spans(compact, starts, ends),
            compact.span_hashes(starts, ends),
            ends - starts,
            owners[segment_starts][segment],
        )

    def _identity(self, hashes: np.ndarray, lengths: np.ndarray | np.int64) -> np.ndarray:
        """Seeded 44-bit identity of a feature from its polynomial hash and length."""
        if np.ndim(lengths) == 0:
            # Scalar arithmetic would warn on the intended wrap-around: one offset for all, modulo 2**64.
            offset = np.uint64((int(lengths) * int(_LENGTH_MIX) + int(self._seed_key)) % 2**64)
        else:
            offset = lengths.astype(np.uint64) * _LENGTH_MIX + self._seed_key
        return mix64(hashes + offset) >> _IDENTITY_SHIFT

    def _identities(self, batch: CodePointBatch) -> np.ndarray:
        """Identities of whole strings (vocabulary keys, excludes)."""
        text = _PolynomialText(batch.code_points)
        return self._identity(text.span_hashes(batch.starts, batch.starts + batch.lengths), batch.lengths)

    def _collect(
        self, lengths: np.ndarray, groups: list[_Group], identities: list[np.ndarray], owners: list[np.ndarray]
    ) -> FeatureBatch:
        """The features of documents of these ``lengths`` (code points) from the identity and document of each
        feature occurrence, found as ``groups``."""
        document_count = len(lengths)
        group_sizes = [len(each) for each in identities]
        # When only a few features of each document are wanted, first keep the occurrences under identity bounds
        # that leave several times that many (sorting all of a long document's features costs more than
        # hashing them), then lift the bounds for any document that they left short. A document's length
        # stands in for its number of occurrences: close for character n-grams, and a poor guess costs time,
        # never a feature.
        if self.least or self.least_per_route:
            bounds = _bounds(_OVERSAMPLE * self.least, lengths)
            route_bounds = _bounds(_ROUTE_OVERSAMPLE * self.least_per_route * self.routes, lengths)
        else:
            bounds, route_bounds = np.full((2, document_count), _IDENTITY_LIMIT)
        while True:
            uncut = (bounds == _IDENTITY_LIMIT) | (route_bounds == _IDENTITY_LIMIT)
            bounds[uncut] = route_bounds[uncut] = _IDENTITY_LIMIT
            if uncut.all():
                features, _ = self._distinct(document_count, groups, group_sizes, _occurrence_keys(identities, owners))
                assert features is not None  # only cut occurrences leave documents short
                return features
            # Cut before the keys are made: a long document keeps a few percent of its occurrences.
            # The document past the last (windows straddling two documents) keeps nothing.
            owner_bounds = np.append(bounds, np.uint64(0))
            owner_route_bounds = np.append(route_bounds, np.uint64(0))
            hits = [
                self._under_bounds(each, owner_bounds[owner], owner_route_bounds[owner])
                for each, owner in zip(identities, owners, strict=True)
            ]
            keys = _occurrence_keys(
                [each[hit] for each, hit in zip(identities, hits, strict=True)],
                [owner[hit] for owner, hit in zip(owners, hits, strict=True)],
            )
            starts = np.cumsum([0, *group_sizes]).tolist()
            shifted = (hit + start for hit, start in zip(hits, starts, strict=False))
            positions = np.concatenate([np.empty(0, dtype=np.intp), *shifted])
            features, short = self._distinct(
                document_count, groups, group_sizes, keys, positions, (bounds, route_bounds)
            )
            if features is not None:
                return features
            bounds[short] = _IDENTITY_LIMIT

    def _under_bounds(self, identities: np.ndarray, bounds: np.ndarray, route_bounds: np.ndarray) -> np.ndarray:
        """Positions of the identities under their bound or under their route bound (within the route)."""
        if not self.least_per_route:
            return np.flatnonzero(identities < bounds)
        under = _within_route(identities, self.routes) < route_bounds
        if self.least:
            under |= identities < bounds
        return np.flatnonzero(under)

    def _distinct(
        self,
        document_count: int,
        groups: list[_Group],
        group_sizes: list[int],
        keys: np.ndarray,
        positions: np.ndarray | None = None,
        bounds: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[FeatureBatch | None, np.ndarray | None]:
        """Each document's distinct features, weighted and filtered, from the (document, identity) key of
        every occurrence (``positions`` maps them into ``groups`` when they are a subset). Where the occurrences
        were cut by ``bounds`` (see :meth:`_least_rows`), and some documents are left with fewer features than
        wanted, there are no features but those documents (``None``, the documents)."""
        if self.hash_name == "fast":
            occurrence = None
            keys = np.sort(keys)
        else:
            # The slow hashes need an occurrence of each feature to recover its text.
            occurrence = np.argsort(keys, kind="stable")
            keys = keys[occurrence]
        # Keys of the document past the last (windows straddling two documents) sort last: cut them off.
        keys = keys[: np.searchsorted(keys, np.uint64(document_count) << _KEY_DOCUMENT_SHIFT)]
        heads = np.ones(len(keys), dtype=bool)
        heads[1:] = keys[1:] != keys[:-1]
        heads = np.flatnonzero(heads)
        settings = self.settings
        # Occurrence counts only matter for frequency bounds and tf weighting.
        counted = settings.frequency_floor > 1 or settings.frequency_ceiling is not None or settings.weighting == "tf"
        counts = np.diff(np.append(heads, len(keys))) if counted else None
        keys = keys[heads]

        identity = keys & _IDENTITY_MASK
        kept = np.ones(len(keys), dtype=bool)
        if counts is not None and settings.frequency_floor > 1:
            kept &= counts >= settings.frequency_floor
        if counts is not None and settings.frequency_ceiling is not None:
            kept &= counts <= settings.frequency_ceiling
        if len(self._excluded):
            kept &= ~np.isin(identity, self._excluded)
        if not kept.all():
            keys, identity, heads = keys[kept], identity[kept], heads[kept]
            if counts is not None:
                counts = counts[kept]
        offsets = np.empty(document_count + 1, dtype=np.intp)
        offsets[:-1] = np.searchsorted(keys, np.arange(document_count, dtype=np.uint64) << _KEY_DOCUMENT_SHIFT)
        offsets[-1] = len(keys)
        if self.least or self.least_per_route:
            wanted, short = self._least_rows(identity, offsets, bounds)
            if short is not None and short.any():
                return None, short
            if wanted is not None:
                identity = identity[wanted]
                if counts is not None:
                    counts = counts[wanted]
                if occurrence is not None:
                    heads = heads[wanted]
                offsets = np.searchsorted(wanted, offsets)

        weights = np.ones(len(identity), dtype=np.float64)
        if len(self._vocabulary_keys):
            slot = np.minimum(np.searchsorted(self._vocabulary_keys, identity), len(self._vocabulary_keys) - 1)
            known = self._vocabulary_keys[slot] == identity
            weights[known] = self._vocabulary_weights[slot[known]]
        if counts is not None and settings.weighting == "tf":
            weights *= counts

        sources = None if occurrence is None else occurrence[heads]
        if sources is not None and positions is not None:
            sources = positions[sources]
        digests = self._digests(identity, sources, groups, group_sizes)
        hashes = digests[:, 0] if digests.shape[1] > 1 else digests.reshape(-1)
        return FeatureBatch(
            hashes=np.ascontiguousarray(hashes), weights=weights, offsets=offsets, digests=digests, identities=identity
        ), None

    def _digests(
        self, identity: np.ndarray, sources: np.ndarray | None, groups: list[_Group], group_sizes: list[int]
    ) -> np.ndarray:
        """Full-width hash words of each feature; ``sources`` locates an occurrence of each in ``groups``."""
        words = self.width // 64
        if self.hash_name == "fast":
            first = mix64(identity ^ _HASH_MIX)
            if words == 1:
                return first[:, None]
            # Further words re-mix the first with the word index.
            digests = mix64(first[:, None] ^ (np.arange(words, dtype=np.uint64) * _WORD_MIX)[None, :])
            digests[:, 0] = first
            return digests
        assert sources is not None
        distinct, first_row, inverse = np.unique(identity, return_index=True, return_inverse=True)
        group_starts = np.cumsum([0, *group_sizes])
        source = sources[first_row]
        group_of = np.searchsorted(group_starts, source, side="right") - 1
        texts: list[str] = [""] * len(distinct)
        for group_index in np.unique(group_of).tolist():
            rows = np.flatnonzero(group_of == group_index)
            local = source[rows] - group_starts[group_index]
            for row, text in zip(rows.tolist(), groups[group_index].texts(local), strict=True):
                texts[row] = text
        digest = _md5_digest if self.hash_name == "md5" else _shake256_digest
        raw = b"".join(digest(text.encode("utf-8", "surrogatepass"), self.seed, words) for text in texts)
        table = np.frombuffer(raw, dtype=">u8").astype(np.uint64).reshape(len(distinct), words)
        return table[inverse.reshape(-1)]

    def _least_rows(
        self, identity: np.ndarray, offsets: np.ndarray, bounds: tuple[np.ndarray, np.ndarray] | None
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The rows of the features wanted (``least`` and ``least_per_route``; None: all of them) from each
        document's distinct features in identity order; and, where their occurrences were cut by ``bounds`` (per
        document: on the identity, within the route), the documents this left with fewer than wanted (None when
        nothing was cut)."""
        sizes = np.diff(offsets)
        documents = len(sizes)
        owner = np.repeat(np.arange(documents, dtype=np.intp), sizes)
        kept = np.zeros(len(identity), dtype=bool)
        short = np.zeros(documents, dtype=bool)
        if self.least:
            kept |= among_first(owner, self.least)
            if bounds is not None:
                # The route bounds keep features of higher identity too: only those under the document's own
                # bound are surely its least.
                under = np.bincount(owner[identity < bounds[0][owner]], minlength=documents)
                short |= under < self.least
        if self.least_per_route:
            # A document's features of one route are contiguous (routes keep identity order). Both bounds keep
            # a prefix of each route, so its first features are its least.
            group = route_of(identity, self.routes)
            group += owner * self.routes
            kept |= among_first(group, self.least_per_route)
            if bounds is not None:
                group_sizes = np.bincount(group, minlength=documents * self.routes).reshape(documents, self.routes)
                short |= (group_sizes < self.least_per_route).any(axis=1)
        if bounds is not None:
            short &= (bounds[0] < _IDENTITY_LIMIT) | (bounds[1] < _IDENTITY_LIMIT)
        return (None if kept.all() else np.flatnonzero(kept)), (None if bounds is None else short)


def _bounds(wanted: float, lengths: np.ndarray) -> np.ndarray:
    """Identity bounds expected to leave ``wanted`` occurrences of documents of these lengths (code points)."""
    return (np.minimum(1.0, wanted / np.maximum(lengths, 1)) * float(_IDENTITY_LIMIT)).astype(np.uint64)


def among_first(runs: np.ndarray, count: int) -> np.ndarray:
    """Whether each element of a sorted array is among the first ``count`` of its run of equal values."""
    first = np.ones(len(runs), dtype=bool)
    first[count:] = runs[count:] != runs[:-count]
    return first


def _occurrence_keys(identities: list[np.ndarray], owners: list[np.ndarray]) -> np.ndarray:
    """(document, identity) of every occurrence in one word: one plain sort orders a batch's occurrences."""
    if not identities:
        return np.empty(0, dtype=np.uint64)
    return np.concatenate(
        [
            (owner.astype(np.uint64) << _KEY_DOCUMENT_SHIFT) | each
            for each, owner in zip(identities, owners, strict=True)
        ]
    )


def _word_grams(
    token_documents: np.ndarray,
    token_hashes: np.ndarray,
    token_lengths: np.ndarray,
    powers: np.ndarray,
    size: int,
    *,
    short: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Word ``size``-grams: first token, token count, polynomial hash and length of each.

    With ``short``, a document with fewer tokens gives one gram of all of them.
    """
    count = len(token_documents)
    positions = np.arange(count, dtype=np.int64)
    last = np.minimum(positions + size - 1, count - 1)
    same = token_documents[last] == token_documents
    full = (positions + size - 1 < count) & same
    if short:
        document_first = np.ones(count, dtype=bool)
        document_first[1:] = token_documents[1:] != token_documents[:-1]
        full |= document_first & ~((positions + size - 1 < count) & same)
    firsts = positions[full]
    hashes = token_hashes[firsts]
    lengths = token_lengths[firsts]
    sizes = np.ones(len(firsts), dtype=np.int64)
    for offset in range(1, size):
        following = np.minimum(firsts + offset, count - 1)
        present = (firsts + offset < count) & (token_documents[following] == token_documents[firsts])
        # hash("a b") = hash("a") + BASE**len(a) * " " + BASE**(len(a) + 1) * hash("b")
        joined = hashes + powers[lengths] * _SPACE_CODE_POINT + powers[lengths + 1] * token_hashes[following]
        hashes = np.where(present, joined, hashes)
        lengths = np.where(present, lengths + 1 + token_lengths[following], lengths)
        sizes += present
    return firsts, sizes, hashes, lengths


def _md5_digest(data: bytes, seed: int, words: int) -> bytes:
    # Seed 0, first 128 bits: MD5 of the text itself, exactly as the Erlang seed; further blocks and other
    # seeds prefix the seed and block number.
    blocks = []
    for block in range((words + 1) // 2):
        prefix = b"" if seed == 0 and block == 0 else struct.pack(">QI", seed, block)
        blocks.append(hashlib.md5(prefix + data, usedforsecurity=False).digest())
    return b"".join(blocks)[: words * 8]


def _shake256_digest(data: bytes, seed: int, words: int) -> bytes:
    prefix = b"" if seed == 0 else struct.pack(">Q", seed)
    return hashlib.shake_256(prefix + data).digest(words * 8)
