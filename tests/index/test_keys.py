"""A batch's table keys: a subset keeps exactly the keys the subset's own sort gives; near pairs follow the plan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup.index import SegmentIndex, make_plan, table_keys
from streamdedup.index.keys import (
    FULL_RUN_LEADS,
    LONE_SEGMENT_LIMIT,
    UNMEASURED,
    HeldRows,
    first_copies,
    most_shared,
    packed,
    with_copies,
)
from streamdedup.index.plan import IndexPlan, make_segment_plan
from tests.index.test_segment import _clustered

PLANS = {
    "exact-64": make_plan(64, 3, 100_000),
    "sampled-256": make_plan(256, 40, 100_000),
    "segments-512": make_segment_plan(512, 16),
    "segments-1024": make_segment_plan(1024, 32),
}


def _fingerprints(plan: IndexPlan, n: int, rng: np.random.Generator) -> np.ndarray:
    fps = _clustered(n, plan.bits // 64, 4, rng)
    if plan.kind == "segments":
        # Some all-zero (unkeyed) segments, as texts with few features give.
        size = plan.bits // len(plan.tables)
        zeroed = rng.random((n, len(plan.tables))) < 0.2
        for segment in range(len(plan.tables)):
            word, slot = divmod(segment, 64 // size)
            fps[zeroed[:, segment], word] &= ~np.uint64(((1 << size) - 1) << (64 - size * (slot + 1)))
    return fps


@pytest.mark.parametrize("name", list(PLANS))
def test_a_subset_of_the_keys_equals_keying_the_subset(name: str) -> None:
    plan = PLANS[name]
    rng = np.random.default_rng(7)
    fps = _fingerprints(plan, 700, rng)
    rows = np.flatnonzero(rng.random(len(fps)) < 0.6)
    whole, direct = table_keys(plan, fps).subset(rows), table_keys(plan, fps[rows])
    assert len(whole) == len(rows)
    for field in ("keys", "values", "runs", "folds"):
        assert np.array_equal(getattr(whole, field), getattr(direct, field)), field
    # Rows of equal keys may come in another order; each table must hold the same (key, row) pairs.
    for table in range(len(plan.tables)):
        assert sorted(zip(whole.keys[table].tolist(), whole.rows[table].tolist(), strict=True)) == sorted(
            zip(direct.keys[table].tolist(), direct.rows[table].tolist(), strict=True)
        )
    assert np.array_equal(np.sort(whole.rows, axis=1), np.tile(np.arange(len(rows)), (len(plan.tables), 1)))
    everything = table_keys(plan, fps)
    assert everything.subset(np.arange(len(fps))) is everything
    # Counts held per position (here: a function of the key) follow their positions into the subset.
    counted = everything.with_held(HeldRows((everything.keys % np.uint64(7)).astype(np.int64), 5)).subset(rows)
    assert counted.held is not None and counted.held.keyed_writes == 5
    assert np.array_equal(counted.held.counts, (counted.keys % np.uint64(7)).astype(np.int64))


@pytest.mark.parametrize("name", ["exact-64", "segments-512"])
def test_pairs_are_the_rows_within_the_radius_that_share_a_key(name: str) -> None:
    plan = PLANS[name]
    fps = _fingerprints(plan, 400, np.random.default_rng(11))
    earlier, later, distances = table_keys(plan, fps).pairs(fps)
    keys = table_keys(plan, fps)
    unsorted_keys = np.empty_like(keys.keys)
    np.put_along_axis(unsorted_keys, keys.rows, keys.keys, axis=1)
    shares = (unsorted_keys[:, :, None] == unsorted_keys[:, None, :]) & (
        (unsorted_keys[:, :, None] != 0) if plan.kind == "segments" else True
    )
    distance = np.bitwise_count(fps[:, None, :] ^ fps[None, :, :]).sum(axis=2)
    expected = np.argwhere(np.triu(shares.any(axis=0) & (distance <= plan.radius), k=1))
    assert len(expected) > 50
    assert np.array_equal(np.stack([earlier, later], axis=1), expected)
    assert distances.tolist() == distance[earlier, later].tolist()
    # Restricted to some rows as the earlier side: exactly the pairs whose earlier row is one of them.
    allowed = np.random.default_rng(12).random(len(fps)) < 0.5
    some_earlier, some_later, some_distances = keys.pairs(fps, allowed)
    chosen = expected[allowed[expected[:, 0]]]
    assert 0 < len(chosen) < len(expected)
    assert np.array_equal(np.stack([some_earlier, some_later], axis=1), chosen)
    assert some_distances.tolist() == distance[some_earlier, some_later].tolist()
    # Unmeasured, the same pairs: their distances wait only where the radius cuts nothing.
    lazy_earlier, lazy_later, lazy_distances = keys.pairs(fps, measured=False)
    assert lazy_earlier.tolist() == earlier.tolist() and lazy_later.tolist() == later.tolist()
    cuts = plan.radius < plan.bits
    assert lazy_distances.tolist() == (distances.tolist() if cuts else [UNMEASURED] * len(distances))


@pytest.mark.parametrize("name", ["segments-512", "segments-1024"])
@pytest.mark.parametrize(("capacity", "limit"), [(1, 1), (2, 5), (4, 3), (8, 3), (400, 2)])
def test_capped_pairs_take_each_keys_first_rows_and_each_later_rows_most_shared(
    name: str, capacity: int, limit: int
) -> None:
    # Brute force: a row is an earlier side through a table when it is among the first `capacity` rows of its
    # key there (the first FULL_RUN_LEADS of a key with `capacity` rows or more); each later row keeps the
    # `limit` earlier rows sharing the most such tables, the latest first, and the first row of each of its keys;
    # a row keyed in LONE_SEGMENT_LIMIT tables or more, only those sharing two tables or more.
    plan = PLANS[name]
    rng = np.random.default_rng(13)
    fps = _fingerprints(plan, 300, rng)
    # Hot keys: many rows share a few segment values.
    fps[rng.random(len(fps)) < 0.5, 0] = fps[0, 0]
    keys = table_keys(plan, fps)
    earlier, later, _ = keys.pairs(fps, key_capacity=capacity, max_candidates=limit)
    unsorted_keys = np.empty_like(keys.keys)
    np.put_along_axis(unsorted_keys, keys.rows, keys.keys, axis=1)
    serves = np.zeros(unsorted_keys.shape, dtype=bool)
    heads = set()
    for table, table_keys_row in enumerate(unsorted_keys):
        for key in np.unique(table_keys_row[table_keys_row != 0]):
            members = np.flatnonzero(table_keys_row == key)
            serves[table, members[: min(FULL_RUN_LEADS, capacity) if len(members) >= capacity else capacity]] = True
            heads.update((int(members[0]), int(later)) for later in members[1:])
    shared = ((unsorted_keys[:, :, None] == unsorted_keys[:, None, :]) & serves[:, :, None]).sum(axis=0)
    shared = np.triu(shared, k=1)
    expected = set()
    for row in range(len(fps)):
        sources = np.flatnonzero(shared[:, row])
        ranked = sorted(sources.tolist(), key=lambda source: (-shared[source, row], -source))[:limit]
        expected.update((source, row) for source in ranked)
    assert len(expected) > 100 and not heads <= expected
    expected |= heads
    keyed = (unsorted_keys != 0).sum(axis=0)
    lone = {(source, row) for source, row in expected if shared[source, row] < 2 and keyed[row] >= LONE_SEGMENT_LIMIT}
    assert bool(lone) == (len(plan.tables) >= LONE_SEGMENT_LIMIT)
    expected -= lone
    assert set(zip(earlier.tolist(), later.tolist(), strict=True)) == expected
    assert np.bincount(later, minlength=len(fps)).max() <= limit + len(plan.tables)
    assert np.array_equal(np.lexsort((later, earlier)), np.arange(len(earlier)))


def test_pairs_of_a_batch_past_32_bit_pair_words() -> None:
    # 65,537 rows: (later, earlier) no longer fits a 32-bit word. Random 64-bit fingerprints share no key; three
    # copies of one (the last rows among them) and a near one are the pairs.
    plan = PLANS["exact-64"]
    n = (1 << 16) + 1
    fps = np.random.default_rng(21).integers(0, 2**64 - 1, size=(n, 1), dtype=np.uint64, endpoint=True)
    fps[[70, n - 2, n - 1]] = fps[70]
    fps[n - 3] = fps[70] ^ np.uint64(0b101)
    earlier, later, distances = table_keys(plan, fps).pairs(fps)
    expected = [(70, n - 3, 2), (70, n - 2, 0), (70, n - 1, 0), (n - 3, n - 2, 2), (n - 3, n - 1, 2), (n - 2, n - 1, 0)]
    assert list(zip(earlier.tolist(), later.tolist(), distances.tolist(), strict=True)) == expected


def test_the_index_refuses_keys_of_another_plan(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    fps = _fingerprints(PLANS["exact-64"], 50, rng)
    with SegmentIndex(tmp_path / "idx", bits=64, radius=3, expected_entries=100_000) as index:
        other = make_plan(64, 2, 100_000)
        with pytest.raises(ValueError, match="of another plan"):
            index.search(fps, keys=table_keys(other, fps))
        with pytest.raises(ValueError, match="do not fit"):
            index.add([str(i) for i in range(10)], fps[:10], keys=table_keys(index.plan, fps))
        index.add([str(i) for i in range(50)], fps, keys=table_keys(index.plan, fps))
        assert (
            index.search(fps[:5], keys=table_keys(index.plan, fps[:5])).rows.tolist()
            == index.search(fps[:5]).rows.tolist()
        )


def test_packed_columns_sort_as_lexsort_does_and_refuse_what_does_not_fit() -> None:
    rng = np.random.default_rng(17)
    rows, shared, named = rng.integers(0, 2048, 5000), rng.integers(0, 33, 5000), rng.integers(0, 2**40, 5000)
    word, widths = packed([rows, shared, named.astype(np.uint64)])
    assert widths == [11, 6, 40]
    assert np.array_equal(np.argsort(word, kind="stable"), np.lexsort((named, shared, rows)))
    assert packed([rows, named.astype(np.uint64) << np.uint64(20)]) is None
    # Columns of 32 bits or fewer pack into 32-bit words.
    narrow = packed([rows, shared, named % 2**15])
    assert narrow is not None and narrow[0].dtype == np.uint32 and narrow[1] == [11, 6, 15]
    assert np.array_equal(np.argsort(narrow[0], kind="stable"), np.lexsort((named % 2**15, shared, rows)))
    assert word.dtype == np.uint64
    # A column of zeros still takes a bit: with it, a 63-bit column fits and a 64-bit one does not.
    zeros = np.zeros(3, np.int64)
    fitting = packed([zeros, np.full(3, 2**63 - 1, np.uint64)])
    assert fitting is not None and fitting[1] == [1, 63]
    assert packed([zeros, np.full(3, 2**63, np.uint64)]) is None


@settings(max_examples=80, deadline=None)
@given(
    candidates=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), max_size=60),
    limit=st.integers(1, 5),
    newest=st.booleans(),
)
def test_most_shared_keeps_each_rows_candidates_sharing_the_most_the_newest_or_earliest_among_equals(
    candidates: list[tuple[int, int]], limit: int, newest: bool
) -> None:
    # Distinct (row, named) pairs sorted as a lookup gives them; named is the pair's position, so newer is higher.
    rows = np.array(sorted(row for row, _ in candidates), dtype=np.int64)
    shared = np.array([count for _, count in candidates], dtype=np.int64)
    named = np.arange(len(rows), dtype=np.uint64) + np.uint64(7)
    expected = []
    for row in set(rows.tolist()):
        mine = [i for i in range(len(rows)) if rows[i] == row]
        expected += sorted(mine, key=lambda i: (-shared[i], -int(named[i]) if newest else int(named[i])))[:limit]
    assert most_shared(rows, named, shared, limit, newest=newest).tolist() == sorted(expected)
    # In any order (the in-batch pairs come sorted by their earlier row): the same candidates.
    order = np.random.default_rng(len(rows)).permutation(len(rows))
    chosen = most_shared(rows[order], named[order], shared[order], limit, newest=newest)
    assert sorted(order[chosen].tolist()) == sorted(expected)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 60), kinds=st.integers(1, 6))
def test_first_copies_name_each_rows_first_identical_row(seed: int, rows: int, kinds: int) -> None:
    # Few fingerprints, several sketches each: rows of one fingerprint and other sketches are no copies.
    rng = np.random.default_rng(seed)
    fingerprints = rng.integers(0, 2**63, size=(kinds, 4), dtype=np.uint64)
    sketches = rng.integers(0, 2**32, size=(kinds * 2, 8), dtype=np.uint32)
    fps = fingerprints[rng.integers(0, kinds, rows)]
    rows_sketches = sketches[rng.integers(0, kinds * 2, rows)]
    expected = [
        next(j for j in range(i + 1) if (fps[j] == fps[i]).all() and (rows_sketches[j] == rows_sketches[i]).all())
        for i in range(rows)
    ]
    assert first_copies(fps, rows_sketches).tolist() == expected


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 40))
def test_a_copy_gets_its_first_copy_and_what_that_was_paired_with(seed: int, rows: int) -> None:
    rng = np.random.default_rng(seed)
    copies = np.array([int(rng.integers(0, i + 1)) if rng.random() < 0.4 else i for i in range(rows)])
    copies = copies[copies]  # a first copy is its own first copy
    firsts = np.flatnonzero(copies == np.arange(rows))
    # Pairs of first copies as earlier sides, any later row, each with a distance of its own.
    found = {
        (int(e), int(later_row)): int(rng.integers(0, 9))
        for e in firsts
        for later_row in range(e + 1, rows)
        if rng.random() < 0.3
    }
    ordered = sorted(found)
    pairs = (
        np.array([e for e, _ in ordered], dtype=np.intp),
        np.array([later_row for _, later_row in ordered], dtype=np.intp),
        np.array([found[p] for p in ordered], dtype=np.int64),
    )
    expected = dict(found)
    for row in range(rows):
        first = int(copies[row])
        if first != row:
            expected.setdefault((first, row), 0)
            for (e, later_row), distance in found.items():
                if later_row == first:
                    expected.setdefault((e, row), distance)
    earlier, later, distances = with_copies(pairs, copies)
    assert list(zip(earlier.tolist(), later.tolist(), strict=True)) == sorted(expected)
    assert distances.tolist() == [expected[p] for p in sorted(expected)]
