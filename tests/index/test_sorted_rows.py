from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup.index import sorted_rows
from streamdedup.index.sorted_rows import SortedRows


@pytest.fixture
def many_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every lookup takes the path of many probes (the directory), however few these tests make."""
    monkeypatch.setattr(sorted_rows, "_FEW_PROBES", 0)


def _rows(keys: list[int], key_bits: int) -> SortedRows:
    ordered = np.sort(np.array(keys, dtype=np.uint64))
    return SortedRows(ordered, ordered * np.uint64(3) + np.uint64(1), key_bits)


def _brute_bounds(rows: SortedRows, probes: np.ndarray) -> tuple[list[int], list[int]]:
    keys = rows.keys.tolist()
    low = [next((i for i, key in enumerate(keys) if key >= probe), len(keys)) for probe in probes.tolist()]
    high = [next((i for i, key in enumerate(keys) if key > probe), len(keys)) for probe in probes.tolist()]
    return low, high


@pytest.mark.parametrize("few_probes", [0, 30], ids=["many probes", "few probes"])
@settings(max_examples=60, deadline=None)
@given(
    key_bits=st.sampled_from([4, 12, 20, 24, 32]),
    data=st.data(),
)
def test_bounds_are_the_rows_of_each_probe_on_every_lookup(few_probes: int, key_bits: int, data: st.DataObject) -> None:
    # A few small keys recur, as hot keys do: probes hold none, one or many rows, and fall past the last.
    key = st.integers(0, 7) | st.integers(0, (1 << key_bits) - 1)
    rows = _rows(data.draw(st.lists(key, max_size=60)), key_bits)
    # Many probes: the first two lookups search, later ones start from a directory built on the third. Few
    # probes: binary searches every time. All agree.
    with mock.patch.object(sorted_rows, "_FEW_PROBES", few_probes):
        for _ in range(4):
            probes = np.unique(np.array(data.draw(st.lists(key, min_size=1, max_size=30)), dtype=np.uint64))
            low, high = rows.bounds(probes)
            assert (low.tolist(), high.tolist()) == _brute_bounds(rows, probes)
    assert (rows._bucket_starts is None) == (few_probes > 0 or len(rows) == 0)


def test_few_probes_never_pay_for_a_directory() -> None:
    rows = _rows(list(range(0, 3000, 3)), key_bits=32)
    few = np.array([0, 1, 2999, 3000], dtype=np.uint64)
    for _ in range(4):
        assert [bound.tolist() for bound in rows.bounds(few)] == [[0, 1, 1000, 1000], [1, 1, 1000, 1000]]
    assert rows._bucket_starts is None
    many = np.arange(sorted_rows._FEW_PROBES + 1, dtype=np.uint64)
    for _ in range(3):
        low, high = rows.bounds(many)
    assert rows._bucket_starts is not None
    assert (high - low).tolist() == [1 if key % 3 == 0 else 0 for key in range(len(many))]


@pytest.mark.usefixtures("many_probes")
def test_short_keys_switch_to_a_directory_of_every_key_on_the_third_lookup() -> None:
    rows = _rows([1, 1, 5, 9, 9, 9], key_bits=4)
    probes = np.array([0, 1, 9, 15], dtype=np.uint64)
    searched = [rows.bounds(probes) for _ in range(2)]
    assert rows._bucket_starts is None
    direct = rows.bounds(probes)
    assert rows._bucket_starts is not None
    assert rows._bucket_starts.tolist() == [0, 0, 2, 2, 2, 2, 3, 3, 3, 3, 6, 6, 6, 6, 6, 6, 6]
    for bounds in (*searched, direct):
        assert [bound.tolist() for bound in bounds] == [[0, 0, 3, 6], [0, 2, 6, 6]]


@pytest.mark.usefixtures("many_probes")
def test_long_keys_get_a_directory_of_their_top_bits_and_settle_probes_within_a_bucket() -> None:
    # Seven rows: a directory of the top 2 bits (four buckets). Bucket 0 holds four rows (more than are compared
    # directly, so it searches), bucket 1 none, bucket 2 one, bucket 3 two of one key.
    top = 1 << 30
    rows = _rows([3, 3, 3, 7, 2 * top + 5, 3 * top, 3 * top], key_bits=32)
    probes = np.array([3, 7, 8, top, 2 * top + 5, 2 * top + 6, 3 * top, 3 * top + 1], dtype=np.uint64)
    for _ in range(3):
        low, high = rows.bounds(probes)
        assert (low.tolist(), high.tolist()) == _brute_bounds(rows, probes)
    assert rows._bucket_starts is not None
    assert rows._bucket_starts.tolist() == [0, 4, 4, 5, 7]


def test_read_gives_each_row_of_the_probed_keys_with_its_probe() -> None:
    # Values are 3 * key + 1 (see _rows): key 9 holds three rows, key 1 two, keys 0 and 15 none.
    rows = _rows([1, 1, 5, 9, 9, 9], key_bits=32)
    owners, values = rows.read(np.array([0, 1, 9, 15], dtype=np.uint64))
    assert (owners.tolist(), values.tolist()) == ([1, 1, 2, 2, 2], [4, 4, 28, 28, 28])


def test_merged_kept_and_emptied_make_new_rows_and_leave_the_old_ones_alone() -> None:
    rows = _rows([2, 4, 4], key_bits=8)
    rows.bounds(np.array([4], dtype=np.uint64))
    rows.bounds(np.array([4], dtype=np.uint64))
    merged = rows.merged(np.array([1, 4, 9], dtype=np.uint64), np.array([100, 101, 102], dtype=np.uint64))
    # Equal keys: the new row after the ones already staged.
    assert merged.keys.tolist() == [1, 2, 4, 4, 4, 9]
    assert merged.values.tolist() == [100, 7, 13, 13, 101, 102]
    assert rows.keys.tolist() == [2, 4, 4] and len(rows) == 3
    assert [bound.tolist() for bound in merged.bounds(np.array([4], dtype=np.uint64))] == [[2], [5]]
    kept = merged.kept(merged.keys != 4)
    assert kept.keys.tolist() == [1, 2, 9] and kept.values.tolist() == [100, 7, 102] and kept.key_bits == 8
    assert len(merged.emptied()) == 0 and merged.emptied().values.dtype == np.uint64


@settings(max_examples=80, deadline=None)
@given(starts=st.lists(st.integers(0, 50), max_size=30), data=st.data())
def test_expanded_ranges_are_every_index_of_each_range_in_order(starts: list[int], data: st.DataObject) -> None:
    # Ranges of at most one index (most lookups), none at all, and longer ones (hot keys) take their own paths.
    longest = data.draw(st.sampled_from([0, 1, 4]))
    counts = data.draw(st.lists(st.integers(0, longest), min_size=len(starts), max_size=len(starts)))
    low = np.array(starts, dtype=np.intp)
    rows, owners = sorted_rows.expand_ranges(low, low + np.array(counts, dtype=np.intp))
    expected = [
        (start + step, i) for i, (start, count) in enumerate(zip(starts, counts, strict=True)) for step in range(count)
    ]
    assert list(zip(rows.tolist(), owners.tolist(), strict=True)) == expected
    assert rows.dtype == np.intp and owners.dtype == np.intp
