from __future__ import annotations

from collections import Counter
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup import minhash
from streamdedup.features import FeatureBatch, FeatureExtractor, mix64
from streamdedup.minhash import EMPTY_SLOT, SKETCH_BITS, SKETCH_DTYPE, BottomK
from streamdedup.settings import FeatureSettings

SMALL_SETS = st.sets(st.integers(0, 300), max_size=30)
# Two narrow ranges make shared values likely, and reach the top of the 31 bits.
SKETCH_VALUE_SETS = st.sets(st.integers(0, 40) | st.integers(2**SKETCH_BITS - 8, 2**SKETCH_BITS - 1), max_size=20)
SHINGLES = FeatureExtractor(FeatureSettings(word_ngrams=[], char_ngrams=[3]))


def batch_of(sets: list[set[int]]) -> FeatureBatch:
    """Each set's members as feature hashes; their identities are the members' own 44-bit mix, ascending."""
    members = [sorted(each, key=identity_of) for each in sets]
    hashes = np.array([value for each in members for value in each], dtype=np.uint64)
    offsets = np.concatenate(([0], np.cumsum([len(each) for each in sets]))).astype(np.int64)
    identities = np.array([identity_of(value) for each in members for value in each], dtype=np.uint64)
    return FeatureBatch(hashes, np.ones(len(hashes)), offsets, hashes[:, None], identities)


def identity_of(value: int) -> int:
    return int(mix64(np.array([value], dtype=np.uint64))[0]) >> 20


def brute_force_sketch(values: set[int], k: int, seed: int | None) -> list[int]:
    if seed is None:
        mixed = np.array([identity_of(value) >> (44 - SKETCH_BITS) for value in values], dtype=np.uint64)
    else:
        mixed = mix64(np.array(sorted(values), dtype=np.uint64) ^ np.uint64(seed)) >> np.uint64(64 - SKETCH_BITS)
    least = sorted(set(mixed.tolist()))[:k]
    return least + [int(EMPTY_SLOT)] * (k - len(least))


def brute_force_jaccard(a: list[int], b: list[int], k: int) -> float:
    """The share in both sketches of the values both see: those up to the smaller of the sketches' largest
    values, a padded sketch (its whole set) setting no bound; all compared at 24 significant bits of the larger
    largest value (a padded sketch's counted as the largest there can be), where a value that comes more than
    once counts once in the union and as shared at each repeat, the estimate at most 1."""
    a_set, b_set = {v for v in a if v != int(EMPTY_SLOT)}, {v for v in b if v != int(EMPTY_SLOT)}
    largest = (max(values) if len(values) == k else 2**SKETCH_BITS - 1 for values in (a_set, b_set))
    cleared = max(max(0, value.bit_length() - 24) for value in largest)
    kept = ~((1 << cleared) - 1)
    bound = min((max(values) & kept for values in (a_set, b_set) if len(values) == k), default=int(EMPTY_SLOT))
    both = Counter([v & kept for v in a_set] + [v & kept for v in b_set])
    union = [v for v in both if v <= bound]
    shared = sum(both[v] - 1 for v in union)
    return min(shared, len(union)) / len(union) if union else 1.0


def classic_bottom_k_jaccard(a: list[int], b: list[int], k: int) -> float:
    """Among the k least values of the union of both sketches, the share in both."""
    a_set, b_set = {v for v in a if v != int(EMPTY_SLOT)}, {v for v in b if v != int(EMPTY_SLOT)}
    union = sorted(a_set | b_set)[:k]
    return sum(1 for v in union if v in a_set and v in b_set) / len(union) if union else 1.0


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sets(st.integers(0, 2**64 - 1), max_size=40), min_size=1, max_size=6),
    st.integers(1, 20),
    st.none() | st.integers(0, 2**32),
)
def test_sketch_is_the_k_least_values_of_one_hash(sets: list[set[int]], k: int, seed: int | None) -> None:
    sketches = BottomK(k, seed).sketch(batch_of(sets))
    assert sketches.shape == (len(sets), k)
    for row, values in zip(sketches, sets, strict=True):
        assert row.tolist() == brute_force_sketch(values, k, seed)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(SMALL_SETS, SMALL_SETS, SMALL_SETS), min_size=1, max_size=5), st.integers(1, 12))
def test_jaccard_is_the_bottom_k_estimate(triples: list[tuple[set[int], set[int], set[int]]], k: int) -> None:
    sketcher = BottomK(k, 3)
    # A shared part makes overlaps of every size likely, padded and full sketches alike.
    left = sketcher.sketch(batch_of([a | shared for a, _, shared in triples]))
    right = sketcher.sketch(batch_of([b | shared for _, b, shared in triples]))
    estimates = sketcher.jaccard(left, right)
    for estimate, a, b in zip(estimates.tolist(), left.tolist(), right.tolist(), strict=True):
        assert estimate == pytest.approx(brute_force_jaccard(a, b, k))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(SKETCH_VALUE_SETS, SKETCH_VALUE_SETS, SKETCH_VALUE_SETS), max_size=40),
    st.integers(1, 12),
    st.none() | st.integers(1, 64),
)
def test_jaccard_of_any_sketches_is_the_estimate_of_their_sets(
    triples: list[tuple[set[int], set[int], set[int]]], k: int, block: int | None
) -> None:
    def sketch(values: set[int]) -> list[int]:
        least = sorted(values)[:k]
        return least + [int(EMPTY_SLOT)] * (k - len(least))

    left = np.array([sketch(a | shared) for a, _, shared in triples], dtype=SKETCH_DTYPE).reshape(-1, k)
    right = np.array([sketch(b | shared) for _, b, shared in triples], dtype=SKETCH_DTYPE).reshape(-1, k)
    # Small blocks put block boundaries between any rows.
    with mock.patch.object(minhash, "_MERGED_PER_BLOCK", block or minhash._MERGED_PER_BLOCK):
        estimates = BottomK(k).jaccard(left, right)
    assert estimates.dtype == np.float64 and estimates.shape == (len(triples),)
    expected = [brute_force_jaccard(a, b, k) for a, b in zip(left.tolist(), right.tolist(), strict=True)]
    assert estimates.tolist() == expected


def test_jaccard_of_rows_named_in_a_is_that_of_the_rows_gathered() -> None:
    rng = np.random.default_rng(8)
    k = 16
    sketches = np.sort(rng.integers(0, 2**SKETCH_BITS, size=(40, k), dtype=np.uint64), axis=1).astype(SKETCH_DTYPE)
    sketches[::4, 10:] = EMPTY_SLOT
    named = rng.integers(0, 40, 3 * minhash._MERGED_PER_BLOCK // (2 * k) + 5)
    other = sketches[rng.integers(0, 40, len(named))]
    sketcher = BottomK(k)
    assert (sketcher.jaccard(sketches, other, a_rows=named) == sketcher.jaccard(sketches[named], other)).all()
    with pytest.raises(ValueError, match="a_rows names 2 rows of a for 3 rows of b"):
        sketcher.jaccard(sketches, other[:3], a_rows=named[:2])


def test_jaccard_over_blocks_of_full_size_is_the_estimate_of_their_sets() -> None:
    rng = np.random.default_rng(5)
    k, pairs = 64, 5 * minhash._MERGED_PER_BLOCK // 128 + 7
    rows: list[tuple[list[int], list[int]]] = []
    for _ in range(pairs):
        # Members of a common range of random width: overlaps of every size, sketches short and full.
        width = int(rng.integers(1, 400))
        a, b = (np.flatnonzero(rng.random(width) < rng.random()).tolist() for _ in range(2))
        rows.append(((a + [int(EMPTY_SLOT)] * k)[:k], (b + [int(EMPTY_SLOT)] * k)[:k]))
    left, right = (np.array(side, dtype=SKETCH_DTYPE) for side in zip(*rows, strict=True))
    expected = [brute_force_jaccard(a, b, k) for a, b in rows]
    assert BottomK(k).jaccard(left, right).tolist() == expected


def test_jaccard_estimates_the_true_index() -> None:
    sketcher = BottomK(256, 11)
    a, b = set(range(0, 3000)), set(range(1000, 4000))  # |A & B| / |A | B| = 2000 / 4000
    sketches = sketcher.sketch(batch_of([a, b, set(), set(range(10_000, 10_100))]))
    estimates = sketcher.jaccard(sketches[[0, 0, 2, 0]], sketches[[1, 0, 2, 3]])
    assert estimates[0] == pytest.approx(0.5, abs=0.1)
    assert estimates[1:].tolist() == [1.0, 1.0, 0.0]


def test_jaccard_is_exact_for_sets_within_their_sketches_and_less_noisy_than_the_k_least_of_the_union() -> None:
    sketcher = BottomK(32, 7)
    a, b = set(range(0, 20)), set(range(10, 30))  # 10 / 30, both within k
    exact = sketcher.jaccard(*sketcher.sketch(batch_of([a, b]))[:, None])
    assert exact.tolist() == [pytest.approx(1 / 3)]
    # 600 pairs of 400-member sets with Jaccard 1/2 (sharing 800 / 3 members): the values below both sketches'
    # bounds number about 4k / 3, and the squared error falls with them.
    rng = np.random.default_rng(3)
    pairs = []
    for start in rng.integers(0, 2**40, 600).tolist():
        pairs += [set(range(start, start + 400)), set(range(start + 400 - 267, start + 800 - 267))]
    sketches = sketcher.sketch(batch_of(pairs))
    left, right = sketches[0::2], sketches[1::2]
    truth = 267 / 533
    ours = ((sketcher.jaccard(left, right) - truth) ** 2).mean()
    classic = np.mean(
        [(classic_bottom_k_jaccard(x, y, 32) - truth) ** 2 for x, y in zip(left.tolist(), right.tolist(), strict=True)]
    )
    assert ours < 0.85 * classic


def test_near_duplicate_texts_share_most_of_their_sketch() -> None:
    sketcher = BottomK(64)
    texts = [
        "the quick brown fox jumps over the lazy dog near the bank",
        "the quick brown fox jumped over the lazy dog near the bank",
        "stock markets fell sharply as investors worried about rates",
    ]
    sketches = sketcher.sketch(SHINGLES.extract(texts))
    near, far = sketcher.jaccard(sketches[[0, 0]], sketches[[1, 2]]).tolist()
    assert near > 0.7 and far < 0.1


def test_cluster_key_is_stable_and_needs_k_shared_members() -> None:
    sketcher = BottomK(4)
    members = set(range(100))
    sketches = sketcher.sketch(batch_of([members, members | {10**6}, set(range(50, 150)), {1, 2}]))
    keys = sketcher.cluster_key(sketches)
    assert isinstance(keys, list) and all(isinstance(key, bytes) and len(key) == 16 for key in keys)
    assert (
        keys[0] == sketcher.cluster_key(sketches[0]) == sketcher.cluster_key(BottomK(4).sketch(batch_of([members]))[0])
    )
    assert keys[0] != keys[2]
    assert keys[3][8:] == bytes.fromhex("ff" * 8)  # two members: the key is padded
    # One more member changes the key only when it hashes below the current k least values.
    smallest = brute_force_sketch(members | {10**6}, 4, None)
    assert (keys[1] == keys[0]) == (smallest == brute_force_sketch(members, 4, None))


def test_seed_and_validation() -> None:
    features = SHINGLES.extract(["some text to sketch"])
    assert BottomK(8, 1).sketch(features).tolist() != BottomK(8, 2).sketch(features).tolist()
    # Without a seed the sketch is the top bits of the features' own least identities.
    top = sorted({identity >> (44 - SKETCH_BITS) for identity in features.identities.tolist()})
    assert BottomK(8).sketch(features)[0].tolist() == top[:8]
    with pytest.raises(ValueError, match="k must be"):
        BottomK(0)
    with pytest.raises(ValueError, match="shape"):
        BottomK(4).jaccard(np.zeros((2, 4), dtype=np.uint64), np.zeros((2, 5), dtype=np.uint64))
