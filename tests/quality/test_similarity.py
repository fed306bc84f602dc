from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup.quality.similarity import jaccard, match_earlier, shingles


def brute_force(sets: list[frozenset[str]], threshold: float) -> tuple[list[float], list[int]]:
    """Every earlier set compared with every later one; the earliest of the best wins ties."""
    best_scores, best_positions = [], []
    for later in range(len(sets)):
        best, position = 0.0, -1
        for earlier in range(later):
            score = jaccard(sets[later], sets[earlier])
            if score > best:
                best, position = score, earlier
        if best < threshold:
            best, position = 0.0, -1
        best_scores.append(best)
        best_positions.append(position)
    return best_scores, best_positions


def test_shingles_are_code_point_trigrams():
    assert shingles("abcd") == {"abc", "bcd"}
    assert shingles("日本語です") == {"日本語", "本語で", "語です"}
    assert shingles("ab") == {"ab"}
    assert shingles("") == frozenset()


def test_jaccard_by_hand():
    assert jaccard(frozenset("abc"), frozenset("bcd")) == pytest.approx(2 / 4)
    assert jaccard(frozenset("ab"), frozenset("ab")) == 1.0
    assert jaccard(frozenset(), frozenset()) == 0.0


def test_match_earlier_by_hand():
    texts = ["the cat sat on the mat", "a dog barked", "the cat sat on the hat", "the cat sat on the mat"]
    found = match_earlier([shingles(text) for text in texts], 0.5)
    assert found.position.tolist() == [-1, -1, 0, 0]
    expected = jaccard(shingles(texts[2]), shingles(texts[0]))
    assert found.similarity.tolist() == pytest.approx([0.0, 0.0, expected, 1.0])


def test_threshold_is_validated():
    with pytest.raises(ValueError, match="threshold"):
        match_earlier([frozenset("ab")], 0.0)


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(st.text(alphabet="abcde ", min_size=0, max_size=14), min_size=0, max_size=40),
    threshold=st.sampled_from([0.2, 0.5, 0.8, 1.0]),
)
def test_match_earlier_equals_brute_force(texts: list[str], threshold: float):
    sets = [shingles(text) for text in texts]
    scores, positions = brute_force(sets, threshold)
    found = match_earlier(sets, threshold)
    assert found.position.tolist() == positions
    np.testing.assert_allclose(found.similarity, scores)
