"""Text normalisation before feature extraction, run over a whole batch at once.

The batch is joined into one string with NUL around every document (a NUL inside a text becomes a space;
no step below creates, removes or composes across it) and encoded to code points once. NFKC, case folding
and the code point classes come from ONE lookup table per code point (with an expansion where one code
point becomes several, as ``ß`` -> ``ss``); documents holding a code point that composes with its
neighbours (combining marks, Hangul jamo) and that are not NFKC already go through ``unicodedata`` instead,
so the result always equals ``unicodedata.normalize("NFKC", text).casefold()``. The ``RT @user:`` prefix
is a regular expression anchored on NUL (matched before NFKC); URLs, @mentions and #hashtags are found
from the punctuation positions with numpy and only marked REMOVED, as blanks are not collapsed: feature
extraction needs neither. :attr:`CodePointBatch.compacted` makes the text as it reads, for those who ask.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np

from .settings import NormalizeSettings

__all__ = [
    "BOUNDARY",
    "JOINER",
    "NOSPACE",
    "PUNCTUATION",
    "REMOVED",
    "SEPARATOR",
    "SPACE",
    "SYMBOL",
    "WORD",
    "CodePointBatch",
    "Normalizer",
    "casefold",
    "classify",
    "code_point_classes",
    "runs",
]

SEPARATOR = "\x00"

# Code point classes (SPACE and PUNCTUATION, the blanks, sit just above BOUNDARY: one subtraction and one
# comparison find them).
BOUNDARY = 0  # NUL: the end of a document
SPACE = 1  # whitespace and other control characters
PUNCTUATION = 2
WORD = 3  # letters and digits of scripts that separate words by spaces
NOSPACE = 4  # letters of scripts written without spaces (Han, kana, Thai, Lao, Khmer, Myanmar)
SYMBOL = 5  # symbols and emoji, private use, unassigned, surrogates
JOINER = 6  # combining marks and format characters (ZWJ, variation selectors): class of the previous code point
REMOVED = 7  # a feed artefact (URL, mention, hashtag, trailing ellipsis): no feature, gone from the text

_UNICODE_SIZE = 0x110000
_CODE_POINT_MASK = 0x1FFFFF
_CLASS_SHIFT = 24
_JOINS = 1 << 29  # the code point is a JOINER (only the flag of a whole batch is looked at)
_EXPANDS = 1 << 30
_UNSTABLE = 1 << 31

# Scripts written without spaces between words; their letters get character n-grams instead of word tokens.
_NOSPACE_RANGES = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x19E0, 0x19FF),  # Khmer symbols
    (0x2E80, 0x2FDF),  # CJK radicals
    (0x3005, 0x3007),  # ideographic iteration mark, closing mark, number zero
    (0x3021, 0x3029),  # Hangzhou numerals
    (0x3031, 0x303C),
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3100, 0x312F),  # Bopomofo
    (0x31A0, 0x31FF),
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFF9F),  # half-width Katakana (when NFKC is off)
    (0x20000, 0x3FFFF),  # CJK extensions B and later
)

# Accents are the combining marks of the Combining Diacritical Marks blocks; Indic vowel signs are parts of
# letters, not accents, and are kept.
_ACCENTS = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")
# Leading "RT @user:" (repeated for retweets of retweets); every document starts after a NUL.
_RETWEET = re.compile(r"\x00[^\S\x00]*(?:[rR][tT][^\S\x00]*@\w+[^\S\x00]*:?[^\S\x00]*)+")

_AT, _HASH, _COLON, _SLASH, _DOT, _UNDERSCORE, _BLANK, _W = (ord(c) for c in "@#:/._ w")
_ELLIPSIS = 0x2026
_LONGEST_SCHEME = 16
# Code points a scan for the end of a user name, hashtag or link looks ahead at once: most end within it.
_SCAN_WINDOW = np.arange(32)


@cache
def code_point_classes() -> np.ndarray:
    """Lookup table code point -> class (uint8, length 0x110000), built once on first use."""
    # Planes 4-13 and 15-16 hold only unassigned and private-use code points (SYMBOL); plane 14 holds tags
    # and variation selectors.
    planes = np.r_[0:0x40000, 0xE0000:0xE1000]
    categories = np.array([unicodedata.category(chr(c)) for c in planes.tolist()])
    major = categories.astype("<U1")
    classes = np.full(len(planes), SYMBOL, dtype=np.uint8)
    classes[(major == "L") | (major == "N")] = WORD
    classes[(major == "Z") | (categories == "Cc")] = SPACE
    classes[major == "P"] = PUNCTUATION
    classes[(major == "M") | (categories == "Cf")] = JOINER
    letters = major == "L"
    for first, last in _NOSPACE_RANGES:
        classes[(planes >= first) & (planes <= last) & letters] = NOSPACE
    table = np.full(_UNICODE_SIZE, SYMBOL, dtype=np.uint8)
    table[planes] = classes
    table[0] = BOUNDARY
    table.flags.writeable = False
    return table


@cache
def _composing() -> frozenset[int]:
    """Code points that can compose with the code point before them (NFC/NFKC quick check "Maybe"): the
    second code point of every two-code-point canonical decomposition, and Hangul vowel and final jamo."""
    seconds = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))
    for code_point in range(0x40000):  # no code point above plane 3 has a decomposition
        decomposition = unicodedata.decomposition(chr(code_point))
        if decomposition and not decomposition.startswith("<"):
            parts = decomposition.split()
            if len(parts) == 2:
                seconds.add(int(parts[1], 16))
    return frozenset(seconds)


@dataclass(frozen=True)
class _Mapping:
    """Per code point: what NFKC and/or case folding make of it, and its class, in one lookup.

    ``entries[c]`` is the single code point c becomes, with its class in bits 24-26, ``_EXPANDS`` when c
    becomes several code points (listed in the expansion arrays), ``_JOINS`` when it is a joiner, and
    ``_UNSTABLE`` when NFKC of a text
    holding c may differ from NFKC of its code points one by one (c combines with its neighbours, or its
    mapping does).
    """

    entries: np.ndarray
    expansion_keys: np.ndarray
    expansion_offsets: np.ndarray
    expansion_values: np.ndarray

    def apply(self, code_points: np.ndarray, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mapped code points and their classes (joiners resolved)."""
        flags = int(np.bitwise_or.reduce(entries)) if len(entries) else 0
        # The top byte holds the class (low three bits) and the flags.
        top = (entries >> np.uint32(_CLASS_SHIFT)).astype(np.uint8)
        if flags & _EXPANDS:
            at = np.flatnonzero((top & np.uint8(_EXPANDS >> _CLASS_SHIFT)) != 0)
            slot = np.searchsorted(self.expansion_keys, code_points[at])
            first = self.expansion_offsets[slot]
            extra = self.expansion_offsets[slot + 1] - first - 1
            heads = self._entries_of(self.expansion_values[first])
            rank = np.arange(int(extra.sum())) - np.repeat(np.cumsum(extra) - extra, extra)
            inserted = self._entries_of(self.expansion_values[np.repeat(first, extra) + rank + 1])
            entries = entries.copy()
            entries[at] = heads
            entries = np.insert(entries, np.repeat(at + 1, extra), inserted)
            flags |= int(np.bitwise_or.reduce(np.concatenate([heads, inserted])))
            top = (entries >> np.uint32(_CLASS_SHIFT)).astype(np.uint8)
        classes = top & np.uint8(7)
        mapped = entries & np.uint32(_CODE_POINT_MASK)
        return mapped, _resolve_joiners(classes) if flags & _JOINS else classes

    @staticmethod
    def _entries_of(code_points: np.ndarray) -> np.ndarray:
        return _entries_of_classes(code_points, code_point_classes())


@cache
def _mapping(nfkc: bool, fold: bool) -> _Mapping:
    classes = code_point_classes()
    entries = _entries_of_classes(np.arange(_UNICODE_SIZE, dtype=np.uint32), classes)
    keys: list[int] = []
    lengths: list[int] = [0]
    values: list[int] = []
    composing = _composing() if nfkc else frozenset()
    # NUL maps to itself and separates: one normalize() and one casefold() over every code point joined by
    # NUL treat each alone (NUL is a starter that composes with nothing), instead of 270,000 calls each.
    code_points = np.r_[1:0x40000, 0xE0000:0xE1000].tolist() if nfkc or fold else []
    originals = [chr(code_point) for code_point in code_points]
    normalized = unicodedata.normalize("NFKC", "\x00".join(originals)).split("\x00") if nfkc else originals
    folded = "\x00".join(normalized).casefold().split("\x00") if fold else normalized
    assert len(folded) == len(originals)
    # Stable: neither a combining mark nor a code point that composes with the one before it.
    stable = [unicodedata.combining(char) == 0 and ord(char) not in composing for char in originals] if nfkc else []
    solid = dict(zip(code_points, stable, strict=False))

    single_sources: list[int] = []
    single_targets: list[int] = []
    single_flags: list[int] = []
    for index, (char, mapped_nfkc, mapped) in enumerate(zip(originals, normalized, folded, strict=True)):
        unstable = nfkc and not (
            stable[index] and (mapped_nfkc == char or all(solid.get(ord(c), True) for c in mapped_nfkc))
        )
        if mapped == char and not unstable:
            continue
        code_point = code_points[index]
        flags = _UNSTABLE if unstable else 0
        if len(mapped) == 1:
            single_sources.append(code_point)
            single_targets.append(ord(mapped))
            single_flags.append(flags)
        else:
            entries[code_point] = code_point | _EXPANDS | flags
            keys.append(code_point)
            values.extend(ord(c) for c in mapped)
            lengths.append(len(mapped))
    targets = _entries_of_classes(np.array(single_targets, dtype=np.uint32), classes)
    entries[np.array(single_sources, dtype=np.intp)] = targets | np.array(single_flags, dtype=np.uint32)
    for array in (entries,):
        array.flags.writeable = False
    return _Mapping(
        entries,
        np.array(keys, dtype=np.uint32),
        np.cumsum(lengths, dtype=np.int64),
        np.array(values, dtype=np.uint32),
    )


def _entries_of_classes(code_points: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Table entries for code points that map to themselves: code point, class, joiner flag."""
    classes = np.take(table, code_points).astype(np.uint32)
    joins = np.where(classes == JOINER, np.uint32(_JOINS), np.uint32(0))
    return code_points | (classes << np.uint32(_CLASS_SHIFT)) | joins


def casefold(code_points: np.ndarray) -> np.ndarray:
    """``str.casefold`` on code points (lookup table, expanded where one folds to several)."""
    mapping = _mapping(False, True)
    return mapping.apply(code_points, np.take(mapping.entries, code_points))[0]


def classify(code_points: np.ndarray) -> np.ndarray:
    """Class of every code point (joiners resolved, see :func:`_resolve_joiners`)."""
    return _resolve_joiners(np.take(code_point_classes(), code_points))


def _resolve_joiners(classes: np.ndarray) -> np.ndarray:
    """A joiner takes the class of the code point before it (a ZWJ inside an emoji sequence is part of the
    emoji, a vowel sign part of its word), or SYMBOL after a blank or at the start."""
    joiners = np.flatnonzero(classes == JOINER)
    if len(joiners):
        previous = joiners - 1
        # Runs of joiners are short: step back until a non-joiner (vectorised over all of them).
        pending = np.flatnonzero((previous >= 0) & (classes[np.maximum(previous, 0)] == JOINER))
        while len(pending):
            previous[pending] -= 1
            still = (previous[pending] >= 0) & (classes[np.maximum(previous[pending], 0)] == JOINER)
            pending = pending[still]
        inherited = np.where(previous >= 0, classes[np.maximum(previous, 0)], SYMBOL)
        inherited[inherited <= PUNCTUATION] = SYMBOL
        classes[joiners] = inherited
    return classes


def runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of the runs of True in ``mask``."""
    edges = np.flatnonzero(np.diff(mask.view(np.int8), prepend=np.int8(0), append=np.int8(0)))
    return edges[::2], edges[1::2]


@dataclass(frozen=True)
class CodePointBatch:
    """A batch of texts as code points, each document followed by one NUL.

    Document i is ``code_points[starts[i]:starts[i] + lengths[i]]``; ``classes`` holds each code point's
    class. Feed artefacts are only marked (class REMOVED) and blanks are not yet collapsed: features need
    neither, so the text is compacted (:attr:`compacted`) only for those who read it.
    """

    code_points: np.ndarray
    classes: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    collapse: bool = False  # runs of spaces, punctuation and removed code points become one space
    removals: bool = False  # some code points are REMOVED

    @classmethod
    def from_texts(cls, texts: Sequence[str]) -> CodePointBatch:
        """The texts as they are (a NUL inside a text becomes a space)."""
        return cls.from_joined(_join(list(texts))[1:])

    @classmethod
    def from_joined(cls, joined: str) -> CodePointBatch:
        """From a string of texts each followed by NUL."""
        code_points = _code_points(joined)
        return cls.from_code_points(code_points, classify(code_points))

    @classmethod
    def from_code_points(
        cls, code_points: np.ndarray, classes: np.ndarray, *, collapse: bool = False, removals: bool = False
    ) -> CodePointBatch:
        ends = np.flatnonzero(classes == BOUNDARY)
        starts = np.empty_like(ends)
        starts[:1] = 0
        starts[1:] = ends[:-1] + 1
        return cls(code_points, classes, starts, ends - starts, collapse, removals)

    def __len__(self) -> int:
        return len(self.starts)

    @cached_property
    def compacted(self) -> CodePointBatch:
        """The text as it reads: removed spans (and, when collapsing, runs of spaces and punctuation) become
        one space, none at a document's start or end."""
        if self.collapse:
            blank = ((self.classes - np.uint8(SPACE)) <= np.uint8(PUNCTUATION - SPACE)) | (self.classes == REMOVED)
        elif self.removals:
            blank = self.classes == REMOVED
        else:
            return self
        run_starts, run_ends = runs(blank)
        # The last code point is always NUL, so index -1 before a leading run also reads as a boundary.
        inner = (self.classes[run_starts - 1] != BOUNDARY) & (self.classes[run_ends] != BOUNDARY)
        keep = ~blank
        keep[run_starts[inner]] = True
        # Where each kept space lands: its position minus the code points dropped by earlier runs.
        dropped = run_ends - run_starts - inner
        at = (run_starts - (np.cumsum(dropped) - dropped))[inner]
        kept = np.flatnonzero(keep)
        code_points, classes = self.code_points[kept], self.classes[kept]
        code_points[at] = _BLANK
        classes[at] = SPACE
        return CodePointBatch.from_code_points(code_points, classes)

    @cached_property
    def solid(self) -> CodePointBatch:
        """The text as it reads with every space taken out: ``compacted`` without its spaces, in one pass."""
        blank = self.classes == SPACE
        if self.collapse:
            blank |= (self.classes - np.uint8(SPACE)) <= np.uint8(PUNCTUATION - SPACE)
        if self.collapse or self.removals:
            blank |= self.classes == REMOVED
        # Indices, not a mask: one search serves both arrays, and a mask this irregular mispredicts.
        kept = np.flatnonzero(~blank)
        return CodePointBatch.from_code_points(self.code_points[kept], self.classes[kept])

    def texts(self) -> list[str]:
        compacted = self.compacted
        return compacted.decode(0, len(compacted.code_points)).split(SEPARATOR)[:-1]

    def decode(self, start: int, stop: int) -> str:
        return self.code_points[start:stop].astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def _join(texts: list[str]) -> str:
    """NUL before every text and after the last; a NUL inside a text becomes a space. Anything but a str
    is a TypeError naming its position."""
    if not texts:
        return SEPARATOR
    try:
        joined = SEPARATOR + SEPARATOR.join(texts) + SEPARATOR
    except TypeError:
        # The join checks every item in C; only a failed one pays for finding the culprit.
        position, text = next((i, t) for i, t in enumerate(texts) if not isinstance(t, str))
        raise TypeError(f"text {position} is {type(text).__name__}, not str") from None
    if joined.count(SEPARATOR) != len(texts) + 1:
        joined = SEPARATOR + SEPARATOR.join(text.replace(SEPARATOR, " ") for text in texts) + SEPARATOR
    return joined


class Normalizer:
    """Applies the configured :class:`NormalizeSettings` steps to a batch of texts."""

    def __init__(self, settings: NormalizeSettings | None = None) -> None:
        self.settings = settings or NormalizeSettings()

    def normalize(self, texts: Sequence[str]) -> list[str]:
        """Normalised texts, one per input, in order (lone surrogates are kept as they are)."""
        return self.normalize_code_points(texts).texts()

    def normalize_code_points(self, texts: Sequence[str]) -> CodePointBatch:
        """Normalised texts as a :class:`CodePointBatch` (what feature extraction consumes)."""
        texts = list(texts)
        settings = self.settings
        joined = _join(texts)
        if not settings.enabled:
            return CodePointBatch.from_joined(joined[1:])
        if settings.strip_retweet:
            joined = _RETWEET.sub(SEPARATOR, joined)
        if settings.strip_accents:
            joined = unicodedata.normalize("NFKD" if settings.nfkc else "NFD", joined)
            joined = unicodedata.normalize("NFC", _ACCENTS.sub("", joined))
        code_points = _code_points(joined)
        mapping = _mapping(settings.nfkc, settings.casefold)
        entries = np.take(mapping.entries, code_points)
        if settings.nfkc and np.bitwise_or.reduce(entries) & _UNSTABLE:
            renormalized = self._nfkc_unstable(joined, code_points, entries)
            if renormalized is not None:
                code_points = _code_points(renormalized)
                entries = np.take(mapping.entries, code_points)
        code_points, classes = mapping.apply(code_points, entries)
        removals = self._remove_artefacts(code_points, classes)
        if settings.strip_ellipsis and not settings.collapse_punctuation:
            # When punctuation collapses, a trailing ellipsis goes with it anyway.
            removals |= self._remove_trailing_ellipses(code_points, classes)
        # The leading NUL goes: every document is followed by one.
        return CodePointBatch.from_code_points(
            code_points[1:], classes[1:], collapse=settings.collapse_punctuation, removals=removals
        )

    @staticmethod
    def _nfkc_unstable(joined: str, code_points: np.ndarray, entries: np.ndarray) -> str | None:
        """NFKC by ``unicodedata`` for the documents where the code-point-wise table may be wrong (they hold a
        code point that combines with its neighbours and are not NFKC already); the new batch string, or
        None when every such document is NFKC already."""
        boundaries = np.flatnonzero(code_points == 0)[:-1]
        unstable = np.flatnonzero(np.bitwise_or.reduceat(entries, boundaries) & _UNSTABLE).tolist()
        texts = joined[1:-1].split(SEPARATOR)
        changed = False
        for index in unstable:
            if not unicodedata.is_normalized("NFKC", texts[index]):
                texts[index] = unicodedata.normalize("NFKC", texts[index])
                changed = True
        return _join(texts) if changed else None

    def _remove_artefacts(self, code_points: np.ndarray, classes: np.ndarray) -> bool:
        """Mark URLs, @mentions and #hashtags REMOVED; whether there were any."""
        settings = self.settings
        starts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        # Every marker (: . @ #) is punctuation: look for them among the punctuation only.
        punctuation = np.flatnonzero(classes == PUNCTUATION)
        marks = code_points[punctuation]
        if settings.strip_urls:
            self._urls(code_points, classes, punctuation[marks == _COLON], punctuation[marks == _DOT], starts, ends)
        for enabled, marker in ((settings.strip_mentions, _AT), (settings.strip_hashtags, _HASH)):
            if enabled:
                # The batch starts and ends with NUL, so a marker always has neighbours.
                at = punctuation[marks == marker]
                at = at[~_wordish(code_points, classes, at - 1) & _wordish(code_points, classes, at + 1)]
                if len(at):
                    starts.append(at)
                    ends.append(_run_end(code_points, classes, at + 1))
        if not starts:
            return False
        _mark_removed(classes, np.concatenate(starts), np.concatenate(ends))
        return True

    @staticmethod
    def _urls(
        code_points: np.ndarray,
        classes: np.ndarray,
        colons: np.ndarray,
        dots: np.ndarray,
        starts: list[np.ndarray],
        ends: list[np.ndarray],
    ) -> None:
        """Spans of ``scheme://...`` and ``www....`` up to the next blank."""
        size = len(code_points)
        colons = colons[colons + 2 < size]
        colons = colons[(code_points[colons + 1] == _SLASH) & (code_points[colons + 2] == _SLASH)]
        first = colons[_ascii_letter(code_points[colons - 1])] - 1
        for _ in range(_LONGEST_SCHEME):
            longer = _ascii_letter(code_points[first - 1])
            if not longer.any():
                break
            first = np.where(longer, first - 1, first)
        dots = dots[dots >= 4]
        for offset in (1, 2, 3):
            dots = dots[(code_points[dots - offset] | 0x20) == _W]
        www = dots - 3
        www = www[~_wordish(code_points, classes, www - 1)]
        found = np.concatenate([first, www])
        if len(found):
            starts.append(found)
            ends.append(_first_where(lambda at: classes[at] <= SPACE, found, size))

    @staticmethod
    def _remove_trailing_ellipses(code_points: np.ndarray, classes: np.ndarray) -> bool:
        """Mark each document's trailing "..." or "…" (and the blanks after it) REMOVED; whether there were any."""
        ends = np.flatnonzero(classes == BOUNDARY)[1:]
        last = ends - 1
        trailing = (classes[last] == SPACE) | (classes[last] == REMOVED)
        while trailing.any():
            last = np.where(trailing, last - 1, last)
            trailing = (classes[last] == SPACE) | (classes[last] == REMOVED)
        first = last.copy()
        dotted = code_points[last] == _DOT
        while dotted.any():
            first = np.where(dotted, first - 1, first)
            dotted = code_points[first] == _DOT
        first += 1
        ellipsis = code_points[last] == _ELLIPSIS
        first = np.where(ellipsis, last, first)
        ellipsis |= (last - first >= 2) & (code_points[last] == _DOT)
        _mark_removed(classes, first[ellipsis], ends[ellipsis])
        return bool(ellipsis.any())


def _mark_removed(classes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
    lengths = ends - starts
    offsets = np.cumsum(lengths) - lengths
    classes[np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()))] = REMOVED


def _ascii_letter(code_points: np.ndarray) -> np.ndarray:
    lowered = code_points | 0x20
    return (lowered >= ord("a")) & (lowered <= ord("z"))


def _wordish(code_points: np.ndarray, classes: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Whether the code points at ``positions`` can be part of a user name or a hashtag."""
    kind = classes[positions]
    return (kind == WORD) | (kind == NOSPACE) | (code_points[positions] == _UNDERSCORE)


def _run_end(code_points: np.ndarray, classes: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """For each position (of a word-like code point), the end of the run of word-like code points there."""
    return _first_where(lambda at: ~_wordish(code_points, classes, at), positions, len(classes))


def _first_where(holds: Callable[[np.ndarray], np.ndarray], positions: np.ndarray, size: int) -> np.ndarray:
    """For each position, the first index at or after it where ``holds`` (given an array of indices, true or
    false for each); the last index, a NUL, must hold. Looks a window ahead for all at once, and further only
    for those not found in it: the spans it ends are short, where a mask over the whole batch costs more."""
    ends = np.empty_like(positions)
    pending = np.arange(len(positions))
    starts = positions.copy()
    while len(pending):
        window = np.minimum(starts[pending, None] + _SCAN_WINDOW, size - 1)
        hits = holds(window)
        found = hits.any(axis=1)
        ends[pending[found]] = window[found, hits[found].argmax(axis=1)]
        pending = pending[~found]
        starts[pending] += len(_SCAN_WINDOW)
    return ends
