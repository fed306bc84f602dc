from __future__ import annotations

import random
from collections import Counter

import pytest

from streamdedup.quality.corpus import (
    CLEARLY_NOVEL,
    DUPLICATE,
    DUPLICATE_FROM,
    EDIT_KINDS,
    NOVEL_BELOW,
    ORIGINAL,
    OTHER,
    BenchDoc,
    Editor,
    build_stream,
    ground_truth_shingles,
    label_stream,
    load_stream,
)
from streamdedup.quality.similarity import jaccard
from streamdedup.quality.sources import SourceItem

TEXT = "The quick brown fox jumps over the lazy dog, then sleeps in the warm afternoon sun."
CHINESE = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"
VOCABULARY = {"en": ["zebra", "violin", "quartz"], "zh": ["龙", "虎", "鹤"]}


@pytest.fixture(scope="module")
def shipped():
    return load_stream()


def editor(seed: int = 1) -> Editor:
    return Editor(random.Random(seed), VOCABULARY)


def similarity(a: str, b: str) -> float:
    first, second = ground_truth_shingles([a, b])
    return jaccard(first, second)


def test_feed_artefacts_vanish_after_normalisation():
    for kind in ("retweet", "link", "hashtag"):
        copy = editor().apply(kind, TEXT, "en")
        assert copy != TEXT
        assert similarity(copy, TEXT) == 1.0, kind
    assert editor().apply("retweet", TEXT, "en").startswith("RT @")
    assert "://" in editor().apply("link", TEXT, "en").split()[-1]
    assert editor().apply("hashtag", TEXT, "en").split()[-1].startswith("#")


def test_word_edits_change_exactly_one_word():
    original = TEXT.split(" ")
    deleted = editor().apply("word_delete", TEXT, "en").split(" ")
    inserted = editor().apply("word_insert", TEXT, "en").split(" ")
    replaced = editor().apply("word_replace", TEXT, "en").split(" ")
    assert len(deleted) == len(original) - 1 and all(word in original for word in deleted)
    assert len(inserted) == len(original) + 1 and sum(word in VOCABULARY["en"] for word in inserted) == 1
    assert len(replaced) == len(original) and sum(a != b for a, b in zip(original, replaced, strict=True)) == 1


def test_chinese_edits_work_on_characters():
    inserted = editor().apply("word_insert", CHINESE, "zh")
    assert len(inserted) == len(CHINESE) + 1 and sum(char in "龙虎鹤" for char in inserted) == 1
    assert len(editor().apply("word_delete", CHINESE, "zh")) == len(CHINESE) - 1
    assert editor().apply("case", CHINESE, "zh") is None  # Chinese has no case


def test_truncation_keeps_most_of_the_text_and_ends_with_an_ellipsis():
    for seed in range(20):
        cut = editor(seed).apply("truncate", TEXT, "en")
        body = cut.rstrip(".… ")
        assert cut.endswith(("...", "…"))
        assert TEXT.startswith(body)
        assert 0.5 * len(TEXT) <= len(body) <= 0.95 * len(TEXT)


def test_case_and_whitespace_edits():
    assert editor().apply("case", TEXT, "en").casefold() == TEXT.casefold()
    spaced = editor().apply("whitespace", TEXT, "en")
    assert spaced != TEXT and spaced.split() == TEXT.split()


def items(count: int, lang: str = "en") -> list[SourceItem]:
    rng = random.Random(count)
    words = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud".split()
    return [
        SourceItem("fortunes", "test", "1", "x", lang, " ".join(rng.choice(words) for _ in range(12)) + f" {n}")
        for n in range(count)
    ]


def test_build_stream_is_deterministic_and_copies_follow_their_original():
    first = build_stream(items(150), "tune", seed=5)
    assert first == build_stream(items(150), "tune", seed=5)
    assert first != build_stream(items(150), "tune", seed=6)
    seen: set[int] = set()
    for doc in first:
        if doc.cluster in seen:
            assert doc.edit != ORIGINAL and doc.label == DUPLICATE
        else:
            assert doc.edit == ORIGINAL
        seen.add(doc.cluster)
    assert len({doc.id for doc in first}) == len(first)
    assert len(first) > 150  # some copies were made
    assert Counter(doc.edit for doc in first)[ORIGINAL] == 150


def test_labels_follow_the_definitions():
    texts = [
        "one fish two fish red fish blue fish",
        "completely different words here today",
        "one fish two fish red fish blue fish!",  # the source repeats itself: Jaccard 1.0 after normalisation
        "one fish two fish red fish yellow cat",  # shares a lot, not enough: other
    ]
    docs = label_stream([_doc(position, cluster=position, text=text) for position, text in enumerate(texts)])
    assert [doc.label for doc in docs] == [CLEARLY_NOVEL, CLEARLY_NOVEL, DUPLICATE, OTHER]
    assert docs[2].match == "d0" and docs[2].jaccard == 1.0
    assert NOVEL_BELOW <= docs[3].jaccard < DUPLICATE_FROM and docs[3].match == "d0"


def _doc(position: int, cluster: int, text: str) -> BenchDoc:
    return BenchDoc(f"d{position}", "tune", "en", cluster, ORIGINAL, OTHER, 0.0, None, text)


def brute_force_labels(docs: list[BenchDoc]) -> list[tuple[str, float]]:
    sets = ground_truth_shingles([doc.text for doc in docs])
    labels = []
    for later, doc in enumerate(docs):
        best = max((jaccard(sets[later], sets[earlier]) for earlier in range(later)), default=0.0)
        in_cluster = any(docs[earlier].cluster == doc.cluster for earlier in range(later))
        if in_cluster or best >= DUPLICATE_FROM:
            labels.append((DUPLICATE, best if best >= NOVEL_BELOW else 0.0))
        elif best < NOVEL_BELOW:
            labels.append((CLEARLY_NOVEL, 0.0))
        else:
            labels.append((OTHER, best))
    return labels


@pytest.mark.parametrize("split", ["tune", "holdout"])
def test_shipped_labels_match_a_brute_force_oracle_on_a_prefix(shipped, split):
    prefix = [doc for doc in shipped if doc.split == split][:500]
    expected = brute_force_labels(prefix)
    assert [(doc.label, doc.jaccard) for doc in prefix] == [
        (label, pytest.approx(score, abs=1e-4)) for label, score in expected
    ]
    assert Counter(label for label, _ in expected)[DUPLICATE] > 20


@pytest.mark.parametrize("split", ["tune", "holdout"])
def test_relabelling_a_prefix_reproduces_the_shipped_labels(shipped, split):
    # Earlier documents of a prefix are the same as in the whole stream, so the labels must not change.
    prefix = [doc for doc in shipped if doc.split == split][:2500]
    assert label_stream(prefix) == prefix


def test_shipped_stream_is_large_and_varied(shipped):
    for split in ("tune", "holdout"):
        docs = [doc for doc in shipped if doc.split == split]
        labels = Counter(doc.label for doc in docs)
        assert labels[CLEARLY_NOVEL] >= 10_000
        assert labels[DUPLICATE] >= 10_000
        edits = Counter(doc.edit for doc in docs if doc.label == DUPLICATE)
        assert set(EDIT_KINDS) <= set(edits) and min(edits[kind] for kind in EDIT_KINDS) >= 500
        assert {doc.lang for doc in docs} == {"de", "en", "es", "it", "ru", "zh"}
        lengths = sorted(len(doc.text) for doc in docs)
        assert 40 <= lengths[len(lengths) // 2] <= 300


def test_copies_stay_recognisable(shipped):
    originals = {(doc.split, doc.cluster): doc.text for doc in shipped if doc.edit == ORIGINAL}
    copies = [doc for doc in shipped if doc.edit != ORIGINAL][:3000]
    sets = ground_truth_shingles([doc.text for doc in copies])
    source_sets = ground_truth_shingles([originals[(doc.split, doc.cluster)] for doc in copies])
    assert min(jaccard(a, b) for a, b in zip(sets, source_sets, strict=True)) >= NOVEL_BELOW
