"""The labelled benchmark stream: real texts, edited copies of them as feeds show them, and ground truth.

Each selected source text starts a cluster; a cluster gets zero or more copies, each made by ONE edit of the
original (or the retweet-truncate-link combination feeds are full of). Copies land after their original at
log-uniform distances, everything interleaved by one seeded shuffle.

Ground truth, over 3-gram shingles of code points after the project's :class:`~streamdedup.normalize.Normalizer`
(default settings, fixed here so a configuration change cannot move the labels):

- ``duplicate``: an earlier document is in the same cluster, or the source itself already holds an earlier
  text with exact Jaccard >= 0.8;
- ``clearly_novel``: exact Jaccard to EVERY earlier document < 0.5 (computed by an exact similarity join);
- ``other``: neither (an unrelated text that shares a lot with an earlier one); dropping it counts nowhere.
"""

from __future__ import annotations

import json
import lzma
import math
import random
import re
import string
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..normalize import Normalizer
from ..settings import NormalizeSettings
from .similarity import jaccard, match_earlier, shingles
from .sources import DATA_DIR, SourceItem, write_records

__all__ = [
    "CLEARLY_NOVEL",
    "DUPLICATE",
    "DUPLICATE_FROM",
    "EDIT_KINDS",
    "NOVEL_BELOW",
    "ORIGINAL",
    "OTHER",
    "STREAM_FILE",
    "BenchDoc",
    "Editor",
    "build_stream",
    "ground_truth_shingles",
    "label_stream",
    "load_stream",
    "vocabulary_of",
    "write_stream",
]

STREAM_FILE = DATA_DIR / "quality_stream.jsonl.xz"

DUPLICATE = "duplicate"
CLEARLY_NOVEL = "clearly_novel"
OTHER = "other"
DUPLICATE_FROM = 0.8  # a source text this close to an earlier one is a duplicate of it
NOVEL_BELOW = 0.5  # a text below this to every earlier one is clearly novel

ORIGINAL = "original"
EDIT_KINDS = (
    "exact",
    "retweet",
    "link",
    "hashtag",
    "case",
    "punctuation",
    "whitespace",
    "word_insert",
    "word_delete",
    "word_replace",
    "truncate",
    "retweet_truncate_link",
)
# How many copies an original gets: most texts are posted once, some are reposted a few times.
COPY_COUNTS = (0, 1, 2, 3, 4, 5)
COPY_WEIGHTS = (0.5, 0.25, 0.12, 0.07, 0.03, 0.03)
# An edit that leaves less than this of the original (a one-word change in a very short text) is redrawn: the
# copy must still be recognisably the same text, and never also "clearly novel".
MIN_COPY_JACCARD = NOVEL_BELOW

_GROUND_TRUTH_NORMALIZER = Normalizer(NormalizeSettings())
_CJK = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_HANDLE_ALPHABET = string.ascii_lowercase + string.digits + "_"
_LINK_ALPHABET = string.ascii_letters + string.digits
_HALF_WIDTH = str.maketrans("，。！？：；（）“”", ',.!?:;()""')


@dataclass(frozen=True, slots=True)
class BenchDoc:
    """One document of the benchmark stream with its ground truth."""

    id: str
    split: str  # "tune" or "holdout"
    lang: str
    cluster: int
    edit: str  # "original" or one of EDIT_KINDS
    label: str  # duplicate / clearly_novel / other
    jaccard: float  # highest exact Jaccard to an earlier document when >= NOVEL_BELOW, else 0.0
    match: str | None  # the earlier document with that Jaccard
    text: str


def ground_truth_shingles(texts: Sequence[str]) -> list[frozenset[str]]:
    """The shingle sets the labels are computed over."""
    return [shingles(text) for text in _GROUND_TRUTH_NORMALIZER.normalize(texts)]


class Editor:
    """Makes edited copies of texts; every choice comes from the one seeded ``random.Random``."""

    def __init__(self, rng: random.Random, vocabulary: dict[str, list[str]]) -> None:
        self.rng = rng
        self.vocabulary = vocabulary
        self._edits: dict[str, Callable[[str, str], str | None]] = {
            "exact": lambda text, lang: text,
            "retweet": self._retweet,
            "link": self._link,
            "hashtag": self._hashtag,
            "case": self._case,
            "punctuation": self._punctuation,
            "whitespace": self._whitespace,
            "word_insert": self._word_insert,
            "word_delete": self._word_delete,
            "word_replace": self._word_replace,
            "truncate": self._truncate,
            "retweet_truncate_link": self._retweet_truncate_link,
        }

    def apply(self, kind: str, text: str, lang: str) -> str | None:
        """The edited text, or None when the edit does not apply (e.g. case in Chinese)."""
        return self._edits[kind](text, lang)

    def _handle(self) -> str:
        return "".join(self.rng.choices(_HANDLE_ALPHABET, k=self.rng.randint(4, 14)))

    def _url(self) -> str:
        host = self.rng.choice(("https://t.co/", "http://bit.ly/", "https://buff.ly/", "https://www.example.org/news/"))
        return host + "".join(self.rng.choices(_LINK_ALPHABET, k=self.rng.randint(6, 12)))

    def _retweet(self, text: str, lang: str) -> str:
        return f"RT @{self._handle()}: {text}"

    def _link(self, text: str, lang: str) -> str:
        return f"{text} {self._url()}"

    def _hashtag(self, text: str, lang: str) -> str:
        words = self.rng.sample(self.vocabulary[lang], self.rng.randint(1, 3))
        if lang == "zh":
            words = ["".join(self.rng.sample(self.vocabulary[lang], 2)) for _ in words]
        return text + " " + " ".join("#" + word for word in words)

    def _case(self, text: str, lang: str) -> str | None:
        changed = self.rng.choice((str.upper, str.lower, str.title))(text)
        return changed if changed != text else None

    def _punctuation(self, text: str, lang: str) -> str | None:
        mode = self.rng.choice(("strip", "exclaim", "quote"))
        if mode == "strip":
            changed = "".join(char for char in text if not unicodedata.category(char).startswith("P"))
        elif mode == "exclaim":
            changed = text.rstrip(".。!！?？ ") + self.rng.choice(("!!!", "!?", "！！", " !!"))
        elif lang == "zh":
            changed = text.translate(_HALF_WIDTH)
        else:
            changed = f"\u201c{text}\u201d"
        return changed if changed != text else None

    def _whitespace(self, text: str, lang: str) -> str:
        pieces = text.split(" ") if lang != "zh" else list(text)
        gaps = len(pieces) - 1
        chosen = set(self.rng.sample(range(gaps), min(gaps, self.rng.randint(1, 4)))) if gaps else set()
        glue = " " if lang != "zh" else ""
        out = pieces[0]
        for position, piece in enumerate(pieces[1:]):
            out += (self.rng.choice(("  ", "\n", "\t", " \n ")) if position in chosen else glue) + piece
        return self.rng.choice(("", " ", "\n")) + out + self.rng.choice(("", " ", "\n", "  "))

    def _units(self, text: str, lang: str) -> tuple[list[str], str]:
        """Words (or, for Chinese, characters) and the glue between them."""
        return (list(text), "") if lang == "zh" else (text.split(" "), " ")

    def _editable(self, units: list[str], lang: str) -> list[int]:
        if lang == "zh":
            return [position for position, unit in enumerate(units) if _CJK.fullmatch(unit)]
        return [position for position, unit in enumerate(units) if any(char.isalpha() for char in unit)]

    def _word_insert(self, text: str, lang: str) -> str:
        units, glue = self._units(text, lang)
        units.insert(self.rng.randint(0, len(units)), self.rng.choice(self.vocabulary[lang]))
        return glue.join(units)

    def _word_delete(self, text: str, lang: str) -> str | None:
        units, glue = self._units(text, lang)
        editable = self._editable(units, lang)
        if len(editable) < 4:
            return None
        del units[self.rng.choice(editable)]
        return glue.join(units)

    def _word_replace(self, text: str, lang: str) -> str | None:
        units, glue = self._units(text, lang)
        editable = self._editable(units, lang)
        if len(editable) < 3:
            return None
        position = self.rng.choice(editable)
        replacement = self.rng.choice(self.vocabulary[lang])
        if replacement == units[position]:
            return None
        units[position] = replacement
        return glue.join(units)

    def _truncate(self, text: str, lang: str) -> str | None:
        keep = int(len(text) * self.rng.uniform(0.7, 0.95))
        cut = text[:keep] if lang == "zh" else text[: text.rfind(" ", 0, keep + 1)]
        cut = cut.rstrip(" ,;:.。，")
        if len(cut) < 0.5 * len(text):
            return None
        return cut + self.rng.choice(("…", "...", " …", " ..."))

    def _retweet_truncate_link(self, text: str, lang: str) -> str | None:
        cut = self._truncate(text, lang)
        return None if cut is None else f"RT @{self._handle()}: {cut} {self._url()}"


def vocabulary_of(items: Iterable[SourceItem]) -> dict[str, list[str]]:
    """Per language, the words (Chinese: characters) an edit may insert, taken from the same texts."""
    words: dict[str, set[str]] = {}
    for item in items:
        bucket = words.setdefault(item.lang, set())
        if item.lang == "zh":
            bucket.update(_CJK.findall(item.text))
        else:
            bucket.update(word for word in item.text.split() if word.isalpha() and 2 <= len(word) <= 12)
    return {lang: sorted(each) for lang, each in words.items()}


def build_stream(
    items: Sequence[SourceItem],
    split: str,
    seed: int,
    *,
    id_prefix: str | None = None,
    max_distance: float = 5000.0,
) -> list[BenchDoc]:
    """The labelled stream of one split: every item once as an original, plus its copies, interleaved.

    ``max_distance`` bounds how many originals later a copy may appear (log-uniform from 0.5 up to it).
    """
    rng = random.Random(seed)
    editor = Editor(rng, vocabulary_of(items))
    originals = list(items)
    rng.shuffle(originals)
    original_sets = ground_truth_shingles([item.text for item in originals])
    placed: list[tuple[float, int, int, str, str, str]] = []  # (key, sequence, cluster, edit, lang, text)
    for cluster, (item, original_set) in enumerate(zip(originals, original_sets, strict=True)):
        placed.append((float(cluster), len(placed), cluster, ORIGINAL, item.lang, item.text))
        for _ in range(rng.choices(COPY_COUNTS, COPY_WEIGHTS)[0]):
            kind, text = _copy(editor, rng, item, original_set)
            distance = math.exp(rng.uniform(math.log(0.5), math.log(max_distance)))
            placed.append((cluster + distance, len(placed), cluster, kind, item.lang, text))
    placed.sort()
    prefix = id_prefix if id_prefix is not None else split
    docs = [
        BenchDoc(f"{prefix}-{position:06d}", split, lang, cluster, kind, OTHER, 0.0, None, text)
        for position, (_, _, cluster, kind, lang, text) in enumerate(placed)
    ]
    return label_stream(docs)


def _copy(editor: Editor, rng: random.Random, item: SourceItem, original_set: frozenset[str]) -> tuple[str, str]:
    """One edited copy (kind, text) that keeps Jaccard >= MIN_COPY_JACCARD to the original."""
    for _ in range(20):
        kind = rng.choice(EDIT_KINDS)
        text = editor.apply(kind, item.text, item.lang)
        if text is not None and jaccard(ground_truth_shingles([text])[0], original_set) >= MIN_COPY_JACCARD:
            return kind, text
    return "exact", item.text


def label_stream(docs: Sequence[BenchDoc]) -> list[BenchDoc]:
    """The same documents with ground-truth labels, Jaccard and match computed over the whole stream."""
    found = match_earlier(ground_truth_shingles([doc.text for doc in docs]), NOVEL_BELOW)
    seen_clusters: set[int] = set()
    labelled = []
    for doc, similarity, position in zip(docs, found.similarity.tolist(), found.position.tolist(), strict=True):
        if doc.cluster in seen_clusters or similarity >= DUPLICATE_FROM:
            label = DUPLICATE
        elif position < 0:
            label = CLEARLY_NOVEL
        else:
            label = OTHER
        seen_clusters.add(doc.cluster)
        match = docs[position].id if position >= 0 else None
        labelled.append(
            BenchDoc(doc.id, doc.split, doc.lang, doc.cluster, doc.edit, label, round(similarity, 4), match, doc.text)
        )
    return labelled


def write_stream(docs: Iterable[BenchDoc], path: Path = STREAM_FILE) -> int:
    """Write the labelled stream as xz-compressed JSON lines; returns how many."""
    return write_records(docs, path)


def load_stream(path: Path = STREAM_FILE, split: str | None = None) -> list[BenchDoc]:
    """The shipped benchmark stream (one split, or both in file order)."""
    with lzma.open(path, "rt", encoding="utf-8") as lines:
        docs = [BenchDoc(**json.loads(line)) for line in lines]
    return [doc for doc in docs if split is None or doc.split == split]
