from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from streamdedup.normalize import Normalizer
from streamdedup.quality.corpus import CLEARLY_NOVEL, DUPLICATE, OTHER
from streamdedup.quality.natural import (
    LONG,
    SHORT,
    NearCopies,
    build_natural,
    description_documents,
    label_natural,
    load_natural,
    near_copies,
    truth_sets,
)
from streamdedup.quality.similarity import TokenSets, jaccard, shingles
from streamdedup.quality.sources import write_records
from streamdedup.settings import NormalizeSettings

PACKAGES = """\
Package: alpha
Version: 1.0-1
Architecture: amd64
Description: tool that frobnicates widgets
 Alpha frobnicates widgets quickly
 and reliably.
 .
 Features:
  * fast
  * small
 .
 This package contains the command-line tool.
Tag: role::program,
 use::converting
Section: utils

Package: beta
Version: 2.0-1
Description: library for widgets
Description-md5: 0123456789abcdef0123456789abcdef
Section: libs

Package: gamma
Version: 3
Description: just a short line
Description-md5: ffffffffffffffffffffffffffffffff

Package: beta
Description-md5: 0123456789abcdef0123456789abcdef
Description-en: library for widgets
 Beta is the widget library.
 .
 This package contains the command-line tool.

Package: unrelated
Description-md5: eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee
Description-en: a translation no package points at
 Never read.
"""


def test_dumpavail_text_becomes_short_descriptions_and_paragraphs():
    assert description_documents(PACKAGES) == [
        ("alpha", SHORT, "tool that frobnicates widgets"),
        ("alpha", LONG, "Alpha frobnicates widgets quickly and reliably."),
        ("alpha", LONG, "Features: fast small"),
        ("alpha", LONG, "This package contains the command-line tool."),
        # beta's Packages record has the short line only: the long description comes from its md5's translation.
        ("beta", SHORT, "library for widgets"),
        ("beta", LONG, "Beta is the widget library."),
        ("beta", LONG, "This package contains the command-line tool."),
        ("gamma", SHORT, "just a short line"),
    ]


def test_build_keeps_repeats_labels_them_and_rebuilds_byte_identically(tmp_path: Path):
    docs = build_natural(PACKAGES)
    assert len(docs) == 8
    assert [doc.id for doc in docs] == [f"natural-{index:06d}" for index in range(8)]
    # The shuffle is seeded: the same order every time, not the input's.
    assert [doc.text for doc in docs] == [doc.text for doc in build_natural(PACKAGES)]
    repeated = [doc for doc in docs if doc.text == "This package contains the command-line tool."]
    first, second = repeated
    assert (first.label, first.jaccard, first.same_as, first.near) == (CLEARLY_NOVEL, 0.0, None, [])
    position = int(first.id.split("-")[1])
    assert (second.label, second.jaccard, second.match, second.same_as, second.near) == (
        DUPLICATE,
        1.0,
        first.id,
        position,
        [position],
    )
    assert Counter(doc.label for doc in docs) == {CLEARLY_NOVEL: 7, DUPLICATE: 1}
    one, two = tmp_path / "one.jsonl.xz", tmp_path / "two.jsonl.xz"
    write_records(docs, one)
    write_records(build_natural(PACKAGES), two)
    assert one.read_bytes() == two.read_bytes()
    loaded, near = load_natural(one)
    assert [doc.text for doc in loaded] == [doc.text for doc in docs]
    assert {doc.edit for doc in loaded} == {SHORT, LONG} and {doc.split for doc in loaded} == {"natural"}
    assert near.near.tolist() == [position]


def test_token_sets_from_whole_batches_equal_shingles():
    rng = random.Random(7)
    texts = [
        "",
        "a",
        "abc",
        "abcd",
        "日本語です",
        "the cat sat",
        *("".join(rng.choices("ab cé", k=rng.randint(0, 12))) for _ in range(200)),
    ]
    sets = TokenSets.shingled(texts, 4)
    reference = TokenSets.of([shingles(text, 4) for text in texts])
    # Both rank rarest first; the same sets must show the same size and the same Jaccard between any two.
    assert np.diff(sets.offsets).tolist() == [len(shingles(text, 4)) for text in texts]
    for _ in range(300):
        i, j = rng.randrange(len(texts)), rng.randrange(len(texts))
        a = set(sets.tokens[sets.offsets[i] : sets.offsets[i + 1]].tolist())
        b = set(sets.tokens[sets.offsets[j] : sets.offsets[j + 1]].tolist())
        expected = jaccard(shingles(texts[i], 4), shingles(texts[j], 4))
        assert (len(a & b) / len(a | b) if a and b else 0.0) == pytest.approx(expected)
    assert len(reference) == len(sets)


@pytest.fixture(scope="module")
def shipped():
    return load_natural()


def test_shipped_split_has_the_expected_counts(shipped):
    docs, near = shipped
    assert len(docs) == len(near) == EXPECTED_DOCUMENTS
    assert Counter(doc.label for doc in docs) == EXPECTED_LABELS
    assert Counter(doc.edit for doc in docs) == EXPECTED_PARTS
    assert docs[0].id == "natural-000000" and docs[-1].id == f"natural-{EXPECTED_DOCUMENTS - 1:06d}"
    # Every duplicate has an earlier near-copy listed; nothing else has.
    has_near = np.diff(near.offsets) > 0
    assert has_near.tolist() == [doc.label == DUPLICATE for doc in docs]


def test_labels_equal_a_brute_force_oracle_on_the_first_documents(shipped):
    docs, near = shipped
    docs, near = docs[:1200], near.head(1200)
    sets = [shingles(text, 4) for text in Normalizer(NormalizeSettings()).normalize([doc.text for doc in docs])]
    first_of = {}
    for position, each in enumerate(sets):
        first_of.setdefault(each, position)
    for later, doc in enumerate(docs):
        scores = [jaccard(sets[earlier], sets[later]) for earlier in range(later)]
        best = max(scores, default=0.0)
        label = DUPLICATE if best >= 0.8 else CLEARLY_NOVEL if best < 0.5 else OTHER
        assert doc.label == label, doc.id
        assert doc.jaccard == (round(best, 4) if best >= 0.5 else 0.0)
        assert doc.match == (docs[scores.index(best)].id if best >= 0.5 else None)
        same = [earlier for earlier in range(later) if sets[earlier] and sets[earlier] == sets[later]]
        assert near.same_as[later] == (same[0] if same else -1)
        expected = [
            earlier for earlier in range(later) if first_of[sets[earlier]] == earlier and scores[earlier] >= 0.8
        ]
        assert near.near[near.offsets[later] : near.offsets[later + 1]].tolist() == expected
    # The slice holds every label to check.
    assert Counter(doc.label for doc in docs) == {CLEARLY_NOVEL: 1068, DUPLICATE: 67, OTHER: 65}


def test_near_copies_published_by_hand():
    texts = [
        "the quick brown fox jumps over the lazy dog",  # 0
        "something else entirely, nothing alike",  # 1
        "the quick brown fox jumps over the lazy dog",  # 2: repeat of 0
        "the quick brown fox jumps over the lazy dog!",  # 3: same shingles as 0 after normalising
        "the quick brown fox jumps over the lazy cat",  # 4: near 0 (Jaccard 0.84)
        "something else entirely, nothing alike at all",  # 5: near 1 (0.82)
    ]
    sets = truth_sets(texts)
    near = near_copies(sets)
    assert near.same_as.tolist() == [-1, -1, 0, 0, -1, -1]
    assert [near.near[near.offsets[j] : near.offsets[j + 1]].tolist() for j in range(6)] == [[], [], [0], [0], [0], [1]]
    keep_all = np.zeros(6, dtype=bool)
    assert near.published(keep_all).tolist() == [False, False, True, True, True, True]
    # 0 dropped: its repeat 2 is kept first, so the later repeat 3 and the near copy 4 are near-copies of 2.
    dropped = np.array([True, False, False, False, False, True])
    assert near.published(dropped).tolist() == [False, False, False, True, True, False]
    # Every copy dropped: nothing published twice.
    assert not near.published(np.array([False, False, True, True, True, True])).any()
    assert near.head(3).published(np.zeros(3, dtype=bool)).tolist() == [False, False, True]


def test_labels_of_a_hand_made_stream():
    labels, similarity, position, near = label_natural(
        ["the quick brown fox jumps over the lazy dog", "the quick brown fox jumps over a lazy cat", "zzz yyy"]
    )
    assert labels == [CLEARLY_NOVEL, OTHER, CLEARLY_NOVEL]
    assert position.tolist() == [-1, 0, -1]
    assert 0.5 <= similarity[1] < 0.8
    assert isinstance(near, NearCopies) and near.near.size == 0


# Debian bookworm's package descriptions (bookworm, bookworm-updates, bookworm-security; main).
EXPECTED_DOCUMENTS = 198_300
EXPECTED_LABELS = {CLEARLY_NOVEL: 100_519, DUPLICATE: 64_305, OTHER: 33_476}
EXPECTED_PARTS = {SHORT: 63_666, LONG: 134_634}
