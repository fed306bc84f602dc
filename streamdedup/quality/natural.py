"""The "natural" split of the quality benchmark: Debian package descriptions, with the duplicates they really hold.

Texts: every package of a Packages-format text (``apt-cache dumpavail``; Debian bookworm, ~63.7k packages)
gives its short description (the first line of ``Description:``) as one document and each paragraph of its long
description (paragraphs are separated by " ." lines; continuation lines folded into one line, a leading bullet
marker dropped) as a document of its own. Packages files of bookworm carry only the short line and a
``Description-md5``; the long descriptions are in the ``Translation-en`` indexes, so the text read is the
dumpavail output followed by those indexes (same stanza format, ``Description-en``), and a package's
description is the translation record with its md5 when it has no long description of its own. Nothing is
deduplicated: the same paragraph in many packages ("This package contains the development files.") is a real
duplicate. Documents that normalise to nothing are left out (they hold no text). One seeded shuffle orders
the stream; a stream of more than MAX_DOCUMENTS is cut to its first CAPPED_DOCUMENTS after the shuffle
(bookworm gives ~198k documents, so nothing is cut).

Ground truth, exact, over character 4-grams (code points, as :func:`~.similarity.shingles`) of the text after
the project's :class:`~streamdedup.normalize.Normalizer` with default settings:

- ``duplicate``: exact Jaccard >= 0.8 to some earlier document;
- ``clearly_novel``: exact Jaccard < 0.5 to EVERY earlier document (an exact similarity join at 0.5);
- ``other``: neither.

Each document also records ``same_as`` (the first earlier document with the same shingle set, or null) and
``near`` (the earlier documents, each the first of its shingle set, with Jaccard >= 0.8): enough to say, for
any set of kept documents, which kept ones are near-copies (Jaccard >= 0.8) of an earlier kept one
(:meth:`NearCopies.published`), without storing the millions of pairs that texts repeated a thousand times make.

Rebuild the shipped file with ``python -m streamdedup.quality.natural`` (reads apt's lists; fetch the
translations once with ``apt-get update -o Acquire::Languages=en``) or ``--packages FILE ...``: the same input
text gives the same file, byte for byte.
"""

from __future__ import annotations

import argparse
import json
import lzma
import random
import re
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..normalize import Normalizer
from ..settings import NormalizeSettings
from .corpus import CLEARLY_NOVEL, DUPLICATE, DUPLICATE_FROM, NOVEL_BELOW, OTHER, BenchDoc
from .similarity import TokenSets, _spans, match_earlier, similar_pairs
from .sources import DATA_DIR, write_records

__all__ = [
    "NATURAL_FILE",
    "NATURAL_SPLIT",
    "NaturalDoc",
    "NearCopies",
    "build_natural",
    "description_documents",
    "label_natural",
    "load_natural",
    "main",
    "near_copies",
    "truth_sets",
]

NATURAL_FILE = DATA_DIR / "natural_stream.jsonl.xz"
NATURAL_SPLIT = "natural"
SHINGLE_SIZE = 4
SEED = 64
MAX_DOCUMENTS = 250_000
CAPPED_DOCUMENTS = 200_000
SHORT, LONG = "short", "long"  # the synopsis line, or one paragraph of the long description

_NORMALIZER = Normalizer(NormalizeSettings())
_STANZA_BREAK = re.compile(r"\n[ \t]*\n")
_BULLET = re.compile(r"^[*+\-\u2022o]\s+")


@dataclass(frozen=True, slots=True)
class NaturalDoc:
    """One document of the natural split with its ground truth (positions count from 0 in stream order)."""

    id: str
    package: str
    part: str  # SHORT or LONG
    label: str  # duplicate / clearly_novel / other
    jaccard: float  # highest exact Jaccard to an earlier document when >= NOVEL_BELOW, else 0.0
    match: str | None  # the (earliest) earlier document with that Jaccard
    same_as: int | None  # position of the first earlier document with the same shingle set
    near: list[int]  # positions of earlier documents, first of their shingle set, with Jaccard >= DUPLICATE_FROM
    text: str


@dataclass(frozen=True, slots=True)
class NearCopies:
    """Which earlier documents every document of a stream is a near-copy of (Jaccard >= DUPLICATE_FROM).

    ``same_as[j]``: the first earlier document with j's shingle set, -1 if none. ``near[offsets[j]:offsets[j+1]]``:
    the earlier documents with Jaccard >= DUPLICATE_FROM to j, each the first of its shingle set (every other
    earlier near-copy of j has the same set as one of them)."""

    same_as: np.ndarray  # int64 (n,)
    near: np.ndarray  # int64
    offsets: np.ndarray  # int64 (n + 1,)

    def __len__(self) -> int:
        return self.same_as.size

    def head(self, count: int) -> NearCopies:
        """The same for the first ``count`` documents (their earlier documents all come before them)."""
        count = min(count, len(self))
        return NearCopies(self.same_as[:count], self.near[: self.offsets[count]], self.offsets[: count + 1])

    def published(self, dropped: np.ndarray) -> np.ndarray:
        """Per document: kept, and a near-copy of an earlier kept document."""
        n = len(self)
        dropped = np.asarray(dropped, dtype=bool)
        if dropped.shape != (n,):
            raise ValueError(f"expected {n} decisions, got {dropped.shape}")
        positions = np.arange(n, dtype=np.int64)
        group = np.where(self.same_as >= 0, self.same_as, positions)
        kept = np.flatnonzero(~dropped)
        # The first kept document of each shingle set (groups are named by their first document).
        first_kept = np.full(n, n, dtype=np.int64)
        np.minimum.at(first_kept, group[kept], kept)
        later = np.repeat(positions, np.diff(self.offsets))
        hit = ~dropped[later] & (first_kept[self.near] < later)
        published = np.zeros(n, dtype=bool)
        published[later[hit]] = True
        return published


def description_documents(packages_text: str) -> list[tuple[str, str, str]]:
    """(package, SHORT or LONG, text) of every package stanza, in order: the short description, then each
    paragraph of the long one. Translation stanzas (``Description-en``) supply long descriptions by md5."""
    packages: list[tuple[str, list[str], str | None]] = []
    translations: dict[str, list[str]] = {}
    for fields in _stanzas(packages_text):
        if "Description-en" in fields and "Description-md5" in fields:
            translations.setdefault(fields["Description-md5"][0], fields["Description-en"])
        elif "Package" in fields and "Description" in fields:
            md5 = fields["Description-md5"][0] if "Description-md5" in fields else None
            packages.append((fields["Package"][0], fields["Description"], md5))
    documents = []
    for package, description, md5 in packages:
        if len(description) == 1 and md5 is not None and md5 in translations:
            description = translations[md5]
        if description[0]:
            documents.append((package, SHORT, description[0]))
        documents.extend((package, LONG, paragraph) for paragraph in _paragraphs(description[1:]))
    return documents


def _stanzas(text: str) -> Iterator[dict[str, list[str]]]:
    """Each stanza's fields: the value's first line, then its continuation lines (leading blank removed)."""
    for stanza in _STANZA_BREAK.split(text.replace("\r\n", "\n")):
        fields: dict[str, list[str]] = {}
        current: list[str] | None = None
        for line in stanza.split("\n"):
            if not line.strip():
                continue
            if line[0] in " \t":
                if current is not None:
                    current.append(line[1:])
                continue
            name, _, value = line.partition(":")
            current = fields[name] = [value.strip()]
        if fields:
            yield fields


def _paragraphs(lines: Sequence[str]) -> Iterator[str]:
    """Paragraphs of a long description: " ." lines separate them; lines folded, bullet markers dropped."""
    paragraph: list[str] = []
    for line in [*lines, "."]:
        stripped = line.strip()
        if stripped == ".":
            if paragraph:
                yield " ".join(paragraph)
            paragraph = []
        elif stripped:
            paragraph.append(_BULLET.sub("", stripped))


def truth_sets(texts: Sequence[str], size: int = SHINGLE_SIZE) -> TokenSets:
    """The shingle sets the ground truth is computed over: ``size``-grams of the normalised texts."""
    return TokenSets.shingled(_NORMALIZER.normalize(list(texts)), size)


def near_copies(sets: TokenSets, threshold: float = DUPLICATE_FROM) -> NearCopies:
    """Exact :class:`NearCopies` of the sets: a similarity join over the first occurrence of every distinct set,
    then each document's earlier near sets (a repeat also lists its own set's first occurrence, Jaccard 1)."""
    n = len(sets)
    positions = np.arange(n, dtype=np.int64)
    group = sets.first_identical()
    firsts = np.flatnonzero(group == positions)
    pairs = similar_pairs(sets.subset(firsts), threshold)
    earlier, later = firsts[pairs.earlier], firsts[pairs.later]
    # Both directions (a repeat of the earlier set that comes after the later set's first occurrence is near
    # it), and each set to itself (a repeat is near its own set's first occurrence).
    source = np.concatenate([later, earlier, firsts])
    target = np.concatenate([earlier, later, firsts])
    order = np.lexsort((target, source))
    source, target = source[order], target[order]
    start = np.searchsorted(source, positions)
    count = np.searchsorted(source, positions, side="right") - start
    # Every document looks at its group's neighbours (its own group included) and keeps the earlier ones.
    owner = np.repeat(positions, count[group])
    found = target[_spans(start[group], count[group])]
    keep = found < owner
    owner, found = owner[keep], found[keep]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=n), out=offsets[1:])
    return NearCopies(np.where(group == positions, -1, group), found, offsets)


def label_natural(texts: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray, NearCopies]:
    """Labels, best earlier Jaccard (0.0 below NOVEL_BELOW) and its position (-1: none), and near-copies."""
    sets = truth_sets(texts)
    found = match_earlier(sets, NOVEL_BELOW)
    labels = [
        DUPLICATE if similarity >= DUPLICATE_FROM else CLEARLY_NOVEL if position < 0 else OTHER
        for similarity, position in zip(found.similarity.tolist(), found.position.tolist(), strict=True)
    ]
    return labels, found.similarity, found.position, near_copies(sets)


def build_natural(packages_text: str, seed: int = SEED) -> list[NaturalDoc]:
    """The labelled natural split from a Packages-format text (dumpavail, then the Translation-en indexes)."""
    documents = description_documents(packages_text)
    normalized = _NORMALIZER.normalize([text for _, _, text in documents])
    documents = [document for document, clean in zip(documents, normalized, strict=True) if clean.strip()]
    random.Random(seed).shuffle(documents)
    if len(documents) > MAX_DOCUMENTS:
        documents = documents[:CAPPED_DOCUMENTS]
    labels, similarity, position, near = label_natural([text for _, _, text in documents])
    ids = [f"{NATURAL_SPLIT}-{index:06d}" for index in range(len(documents))]
    return [
        NaturalDoc(
            ids[index],
            package,
            part,
            labels[index],
            round(float(similarity[index]), 4),
            ids[position[index]] if position[index] >= 0 else None,
            int(near.same_as[index]) if near.same_as[index] >= 0 else None,
            near.near[near.offsets[index] : near.offsets[index + 1]].tolist(),
            text,
        )
        for index, (package, part, text) in enumerate(documents)
    ]


def load_natural(path: Path = NATURAL_FILE) -> tuple[list[BenchDoc], NearCopies]:
    """The shipped natural split as bench documents (``edit`` is the part: short or long) and its near-copies."""
    docs, same_as, near, counts = [], [], [], []
    with lzma.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            docs.append(
                BenchDoc(
                    record["id"],
                    NATURAL_SPLIT,
                    "en",
                    -1,
                    record["part"],
                    record["label"],
                    record["jaccard"],
                    record["match"],
                    record["text"],
                )
            )
            same_as.append(-1 if record["same_as"] is None else record["same_as"])
            near.extend(record["near"])
            counts.append(len(record["near"]))
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return docs, NearCopies(np.array(same_as, dtype=np.int64), np.array(near, dtype=np.int64), offsets)


def _apt_packages_text() -> str:
    """This machine's ``apt-cache dumpavail`` followed by its Translation-en indexes."""
    dumpavail = subprocess.run(["apt-cache", "dumpavail"], check=True, capture_output=True, text=True).stdout
    listed = subprocess.run(
        ["apt-get", "indextargets", "--format", "$(FILENAME)", "Identifier: Translations"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    translations = [
        subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", name], check=True, capture_output=True, text=True).stdout
        for name in sorted(name for name in listed if name.split("/")[-1].split("_")[-1].startswith("Translation-en"))
    ]
    if not translations:
        raise SystemExit("apt has no Translation-en index: run apt-get update -o Acquire::Languages=en first")
    return "\n\n".join([dumpavail, *translations])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamdedup.quality.natural", description=__doc__)
    parser.add_argument(
        "--packages",
        type=Path,
        nargs="+",
        help="Packages-format files read in this order (dumpavail output, then Translation-en); default: apt's",
    )
    parser.add_argument("--output", type=Path, default=NATURAL_FILE, help="where to write the labelled split")
    args = parser.parse_args(argv)
    if args.packages:
        text = "\n\n".join(path.read_text(encoding="utf-8") for path in args.packages)
    else:
        text = _apt_packages_text()
    docs = build_natural(text)
    count = write_records(docs, args.output)
    labels = {label: sum(doc.label == label for doc in docs) for label in (DUPLICATE, CLEARLY_NOVEL, OTHER)}
    print(f"wrote {count} documents to {args.output}: {labels}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
