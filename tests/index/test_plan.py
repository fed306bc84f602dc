from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup.index import IndexPlan, PlanError, make_plan
from streamdedup.index.plan import fold, gather_bits, unpack_bits


def _flip(fps: np.ndarray, distance: int, rng: np.random.Generator) -> np.ndarray:
    """Copies of ``fps`` with exactly ``distance`` distinct random bits flipped per row."""
    bits = fps.shape[1] * 64
    out = fps.copy()
    positions = np.argsort(rng.random((len(fps), bits)), axis=1)[:, :distance]
    for column in range(distance):
        pos = positions[:, column]
        out[np.arange(len(fps)), pos // 64] ^= np.left_shift(np.uint64(1), (63 - pos % 64).astype(np.uint64))
    return out


def test_google_setting_gets_four_tables_of_sixteen_bits_at_one_million() -> None:
    plan = make_plan(64, 3, 1_000_000)
    assert plan.kind == "exact"
    assert (plan.blocks, plan.keyed_blocks, len(plan.tables)) == (4, 1, 4)
    assert plan.key_bits == (16, 16, 16, 16)
    assert plan.tables[1] == tuple(range(16, 32))
    assert plan.candidates_per_query(1_000_000) == pytest.approx(4 * 1_000_000 / 2**16)


def test_larger_expected_size_buys_more_tables_with_longer_keys() -> None:
    assert len(make_plan(64, 3, 10_000_000).tables) == 4
    small, large = make_plan(64, 3, 1_000_000), make_plan(64, 3, 100_000_000)
    assert (large.blocks, large.keyed_blocks, len(large.tables)) == (5, 2, 10)
    assert min(large.key_bits) > max(small.key_bits)
    # The larger plan reads far fewer candidates at its own size than the four-table plan would.
    assert large.candidates_per_query(100_000_000) < small.candidates_per_query(100_000_000) / 20


def test_keys_are_capped_so_buckets_stay_dense() -> None:
    plan = make_plan(256, 3, 100_000)
    assert plan.kind == "exact" and len(plan.tables) == 4
    assert max(plan.key_bits) == math.floor(math.log2(100_000 / 8))


def test_wide_fingerprint_with_large_radius_gets_a_sampled_plan_with_computed_recall() -> None:
    plan = make_plan(128, 12, 20_000, max_tables=4, max_candidates=64)
    assert plan.kind == "sampled" and len(plan.tables) == 4
    recalls = [plan.recall(d) for d in range(13)]
    assert recalls[0] == 1.0
    assert all(a >= b for a, b in pairwise(recalls))
    assert 0.5 < recalls[12] < 0.95


@pytest.mark.parametrize("distance", [4, 8, 12, 16])
def test_computed_recall_matches_measured_recall_of_the_plan_keys(distance: int) -> None:
    plan = make_plan(128, 12, 20_000, max_tables=3, max_candidates=64)
    rng = np.random.default_rng(distance)
    n = 20_000
    fps = rng.integers(0, 2**64 - 1, size=(n, 2), dtype=np.uint64, endpoint=True)
    near = _flip(fps, distance, rng)
    hit = np.zeros(n, dtype=bool)
    for key in plan.tables:
        hit |= gather_bits(fps, key) == gather_bits(near, key)
    expected = plan.recall(distance)
    sigma = math.sqrt(expected * (1 - expected) / n)
    assert abs(hit.mean() - expected) <= 4 * sigma + 1e-12


def test_exact_recall_is_one_inside_the_radius_and_computed_outside() -> None:
    plan = make_plan(64, 3, 1_000_000)
    assert [plan.recall(d) for d in range(4)] == [1.0] * 4
    # Outside the radius: found when one of the four disjoint 16-bit blocks is untouched (inclusion-exclusion).
    untouched = sum((-1) ** (s + 1) * math.comb(4, s) * math.comb(64 - 16 * s, 4) for s in range(1, 5))
    assert plan.recall(4) == pytest.approx(untouched / math.comb(64, 4))


@settings(max_examples=40, deadline=None)
@given(
    width=st.sampled_from([64, 128, 256]),
    radius=st.integers(0, 6),
    entries=st.integers(1, 10_000_000),
    seed=st.integers(0, 2**32 - 1),
)
def test_exact_plans_put_every_pair_within_the_radius_in_a_shared_bucket(
    width: int, radius: int, entries: int, seed: int
) -> None:
    plan = make_plan(width, radius, entries)
    if plan.kind != "exact":
        return
    rng = np.random.default_rng(seed)
    fps = rng.integers(0, 2**64 - 1, size=(300, width // 64), dtype=np.uint64, endpoint=True)
    near = _flip(fps, radius, rng)
    shared = np.zeros(len(fps), dtype=bool)
    for key in plan.tables:
        shared |= gather_bits(fps, key) == gather_bits(near, key)
    assert shared.all()


def test_plan_round_trips_through_json_and_rejects_bad_keys() -> None:
    plan = make_plan(128, 5, 50_000)
    assert IndexPlan.from_json(plan.to_json()) == plan
    with pytest.raises(PlanError):
        IndexPlan("exact", 64, 3, ((0, 64),))
    with pytest.raises(PlanError):
        make_plan(96, 3, 1000)
    with pytest.raises(PlanError):
        make_plan(64, 64, 1000)


def test_gather_bits_matches_a_bit_by_bit_reading() -> None:
    rng = np.random.default_rng(7)
    fps = rng.integers(0, 2**64 - 1, size=(200, 2), dtype=np.uint64, endpoint=True)
    bits = unpack_bits(fps)
    for positions in [
        (0, 1, 2, 63, 64, 65, 127),
        tuple(range(64)),
        tuple(range(50, 80)),
        tuple(rng.choice(128, 20, replace=False).tolist()),
    ]:
        weights = np.left_shift(np.uint64(1), np.arange(len(positions) - 1, -1, -1, dtype=np.uint64))
        expected = (bits[:, list(positions)].astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
        assert np.array_equal(gather_bits(fps, positions), expected)
    assert np.array_equal(fold(fps), fps[:, 0] ^ fps[:, 1])
