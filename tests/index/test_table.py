from __future__ import annotations

from collections import Counter
from pathlib import Path

import lmdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamdedup.index.table import DuplicateRows, PackedBuckets, SortedRuns, bytes_int, int_bytes, rows_in

_rows = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2**64 - 1) | st.integers(0, 3)), max_size=40)


@given(_rows, _rows)
@settings(max_examples=200, deadline=None)
def test_rows_in_agrees_with_a_set_of_pairs(rows: list[tuple[int, int]], others: list[tuple[int, int]]) -> None:
    keys, values = (
        (np.array(column, dtype=np.uint64) for column in zip(*rows, strict=True))
        if rows
        else (np.zeros(0, np.uint64),) * 2
    )
    other_keys, other_values = (
        (np.array(column, dtype=np.uint64) for column in zip(*others, strict=True))
        if others
        else (np.zeros(0, np.uint64),) * 2
    )
    assert rows_in(keys, values, other_keys, other_values).tolist() == [row in set(others) for row in rows]


@pytest.mark.parametrize("width", [1, 2, 5, 8])
def test_integers_round_trip_through_big_endian_bytes(width: int) -> None:
    ints = np.array(sorted({0, 1, 255, 2 ** (8 * width) - 1, min(256, 2 ** (8 * width) - 1)}), dtype=np.uint64)
    encoded = int_bytes(ints, width)
    assert encoded[2] == b"\x00" * (width - 1) + b"\xff"
    assert sorted(encoded) == encoded  # big-endian: byte order is numeric order, as LMDB sorts keys
    assert bytes_int(np.frombuffer(b"".join(encoded), np.uint8).reshape(-1, width)).tolist() == ints.tolist()


@pytest.mark.parametrize("layout", [DuplicateRows, PackedBuckets, SortedRuns])
def test_a_table_reads_what_was_inserted_and_not_what_was_deleted(
    tmp_path: Path, layout: type[DuplicateRows] | type[PackedBuckets] | type[SortedRuns]
) -> None:
    # A brute-force multiset of rows as the oracle, through batches of inserts (with repeated rows) and deletes.
    rng = np.random.default_rng(3)
    env = lmdb.open(str(tmp_path), max_dbs=4, map_size=1 << 26)
    table = layout(env, env.open_db(b"t", **layout.flags), 16, 2, 6)
    stored: Counter[tuple[int, int]] = Counter()
    for size in [300, 6, 5, 300, 7, 4, 300, 300, 8, 3, 6, 300]:
        # A batch for most keys rewrites the table; a few rows rewrite just their buckets.
        # Keys and values that use their high bytes (16-bit keys, 48-bit values).
        keys = rng.integers(0, 40, size).astype(np.uint64) * np.uint64(1500)
        values = rng.integers(0, 50, size).astype(np.uint64) << np.uint64(42)
        order = np.argsort(keys, kind="stable")
        with env.begin(write=True) as txn:
            table.insert(txn, keys[order], values[order])
        stored.update(zip(keys.tolist(), values.tolist(), strict=True))
        doomed = list(stored)[:: rng.integers(3, 6)]
        with env.begin(write=True) as txn:
            table.delete(txn, *(np.array(column, dtype=np.uint64) for column in zip(*doomed, strict=True)))
        for row in doomed:
            del stored[row]
        probe = np.arange(0, 45, dtype=np.uint64) * np.uint64(1500)  # some keys never stored
        with env.begin() as txn:
            owners, found_values = table.read(txn, probe)
        found_keys = probe[owners]
        # Buckets come whole and in key order; dupsort stores a repeated row once, buckets and runs every copy.
        assert found_keys.tolist() == sorted(found_keys.tolist())
        found = Counter(zip(found_keys.tolist(), found_values.tolist(), strict=True))
        assert set(found) == set(stored)
        if layout is not DuplicateRows:
            assert found == stored
        # Only stored keys: every probe has rows.
        present = np.unique(np.array([key for key, _ in stored], dtype=np.uint64))
        with env.begin() as txn:
            owners, found_values = table.read(txn, present)
        found = Counter(zip(present[owners].tolist(), found_values.tolist(), strict=True))
        assert found == stored if layout is not DuplicateRows else set(found) == set(stored)
    env.close()


def test_buckets_take_less_room_than_dupsort_rows_when_keys_hold_many(tmp_path: Path) -> None:
    # The reason for the bucket layout: 16-bit keys of ~15 rows each, as the 1M-entry 64-bit plan has them.
    rng = np.random.default_rng(5)
    used = {}
    for layout in (DuplicateRows, PackedBuckets):
        env = lmdb.open(str(tmp_path / layout.__name__), max_dbs=4, map_size=1 << 30)
        table = layout(env, env.open_db(b"t", **layout.flags), 16, 2, 6)
        for _ in range(10):
            keys = np.sort(rng.integers(0, 2**16, 100_000).astype(np.uint64))
            with env.begin(write=True) as txn:
                table.insert(txn, keys, rng.integers(0, 2**48, len(keys)).astype(np.uint64))
        with env.begin() as txn:
            stat = txn.stat(table.db)
        used[layout] = (stat["leaf_pages"] + stat["branch_pages"] + stat["overflow_pages"]) * stat["psize"] / 1_000_000
        env.close()
    assert used[PackedBuckets] <= 11.0 < 12.0 <= used[DuplicateRows]


def test_rows_read_back_every_row_in_order_and_replace_stores_exactly_the_rows_given(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    env = lmdb.open(str(tmp_path), max_dbs=4, map_size=1 << 28)
    table = DuplicateRows(env, env.open_db(b"t", **DuplicateRows.flags), 32, 4, 8)
    keys = rng.integers(0, 2**32, 5_000).astype(np.uint64)
    keys[:100] = keys[100:200]  # keys of two rows
    values = rng.choice(2**40, 5_000, replace=False).astype(np.uint64)
    with env.begin(write=True) as txn:
        order = np.argsort(keys, kind="stable")
        table.insert(txn, keys[order], values[order])
    by_row = np.lexsort((values, keys))
    with env.begin() as txn:
        stored_keys, stored_values = table.rows(txn)
    assert stored_keys.tolist() == keys[by_row].tolist() and stored_values.tolist() == values[by_row].tolist()
    kept = by_row[::3]
    with env.begin(write=True) as txn:
        table.replace(txn, keys[kept], values[kept])
    with env.begin() as txn:
        assert [row.tolist() for row in table.rows(txn)] == [keys[kept].tolist(), values[kept].tolist()]
        assert txn.stat(table.db)["entries"] == len(kept)
    # Append mode drops a key's value that comes after a greater one without an error: replace refuses it.
    with env.begin(write=True) as txn, pytest.raises(ValueError, match="1 of 3 rows"):
        table.replace(txn, np.array([5, 7, 7], dtype=np.uint64), np.array([1, 9, 8], dtype=np.uint64))
    env.close()


@pytest.mark.parametrize("rows_in_memory", [False, True])
def test_runs_merge_four_at_a_time_and_read_back_every_row_in_key_order(tmp_path: Path, rows_in_memory: bool) -> None:
    # A brute-force list of rows as the oracle, through many small merges (as a table's turns bring them), a
    # replace, and reads of present, absent and hot keys; the runs read from LMDB or held in memory.
    rng = np.random.default_rng(21)
    env = lmdb.open(str(tmp_path), max_dbs=4, map_size=1 << 28)
    table = SortedRuns(env, env.open_db(b"t"), 32, 4, 6, rows_in_memory=rows_in_memory)
    hot = rng.integers(0, 2**32, 5).astype(np.uint64)
    stored_keys, stored_values = np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    next_value = 0
    # The runs' sizes as the rule makes them: the newest four merge once the oldest of them holds no more rows
    # than the other three together, again until they do not.
    expected_runs: list[int] = []
    for _ in range(40):
        size = int(rng.integers(1, 400))
        keys = np.where(rng.random(size) < 0.2, rng.choice(hot, size), rng.integers(0, 2**32, size)).astype(np.uint64)
        keys = np.sort(keys)
        values = np.arange(next_value, next_value + size, dtype=np.uint64)
        next_value += size
        expected_runs.append(size)
        while len(expected_runs) >= 4 and expected_runs[-4] <= sum(expected_runs[-3:]):
            expected_runs[-4:] = [sum(expected_runs[-4:])]
        with env.begin(write=True) as txn:
            table.insert(txn, keys, values)
        stored_keys, stored_values = np.concatenate([stored_keys, keys]), np.concatenate([stored_values, values])
        order = np.argsort(stored_keys, kind="stable")
        with env.begin() as txn:
            runs = table._catalog(txn)[1]
            assert runs["rows"].tolist() == expected_runs
            assert table.row_count(txn) == len(stored_keys)
            keys_read, values_read = table.rows(txn)
            assert keys_read.tolist() == stored_keys[order].tolist()
            assert values_read.tolist() == stored_values[order].tolist()  # within a key, oldest first
            probes = np.unique(np.concatenate([hot, stored_keys[::7], rng.integers(0, 2**32, 50).astype(np.uint64)]))
            owners, values_found = table.read(txn, probes)
        expected = [(key, value) for key, value in zip(stored_keys.tolist(), stored_values.tolist(), strict=True)]
        found = list(zip(probes[owners].tolist(), values_found.tolist(), strict=True))
        assert sorted(found) == sorted(pair for pair in expected if pair[0] in set(probes.tolist()))
        assert owners.tolist() == sorted(owners.tolist())
    # A replace leaves one run of exactly the rows given; the next merge starts new runs after it.
    kept = np.flatnonzero(rng.random(len(stored_keys)) < 0.5)
    order = np.argsort(stored_keys[kept], kind="stable")
    with env.begin(write=True) as txn:
        table.replace(txn, stored_keys[kept][order], stored_values[kept][order])
        table.insert(txn, np.array([7], dtype=np.uint64), np.array([next_value], dtype=np.uint64))
    with env.begin() as txn:
        assert len(table._catalog(txn)[1]) == 2
        keys_read, _ = table.rows(txn)
        assert keys_read.tolist() == sorted([*stored_keys[kept].tolist(), 7])
    env.close()


def test_a_turn_that_may_not_rewrite_postpones_exactly_the_merges_that_would_leave_one_run(tmp_path: Path) -> None:
    # merge_due(may_rewrite=False) foretells the runs' merges: not due exactly when inserting the rows would merge
    # every run into one; any other merge (or a table's first run) is due at any turn.
    rng = np.random.default_rng(3)
    env = lmdb.open(str(tmp_path), max_dbs=4, map_size=1 << 28)
    table = SortedRuns(env, env.open_db(b"t"), 32, 4, 6)
    outcomes = []
    for _ in range(80):
        size = int(rng.integers(1, 300))
        keys = np.sort(rng.integers(0, 2**32, size).astype(np.uint64))
        with env.begin(write=True) as txn:
            had = len(table._catalog(txn)[1])
            due = table.merge_due(txn, size, may_rewrite=False)
            assert table.merge_due(txn, size, may_rewrite=True)
            table.insert(txn, keys, np.arange(size, dtype=np.uint64))
            whole = had > 0 and len(table._catalog(txn)[1]) == 1
        assert due == (not whole)
        outcomes.append(due)
    assert 3 <= outcomes.count(False) < 75
    env.close()


def test_runs_take_about_eleven_bytes_a_row(tmp_path: Path) -> None:
    # What the runs layout is for: a table of 4-byte keys and 6-byte entry keys, merged batch after batch.
    rng = np.random.default_rng(22)
    env = lmdb.open(str(tmp_path), max_dbs=4, map_size=1 << 30)
    table = SortedRuns(env, env.open_db(b"t"), 32, 4, 6)
    for merge in range(20):
        keys = np.sort(rng.integers(0, 2**32, 20_000).astype(np.uint64))
        with env.begin(write=True) as txn:
            table.insert(txn, keys, np.arange(merge * 20_000, (merge + 1) * 20_000, dtype=np.uint64))
    with env.begin() as txn:
        stat = txn.stat(table.db)
        rows = table.row_count(txn)
    used = (stat["leaf_pages"] + stat["branch_pages"] + stat["overflow_pages"]) * stat["psize"]
    assert rows == 400_000 and used / rows < 12.0
    env.close()


@pytest.mark.parametrize("rows_in_memory", [False, True])
def test_a_run_written_by_an_aborted_transaction_is_not_taken_for_the_one_written_after_it(
    tmp_path: Path, rows_in_memory: bool
) -> None:
    # Two writers (two processes' table objects, each with its own copies of what it read): the first writes a
    # run and aborts, the second writes its own run under the same number and commits; the first reads the second's.
    env = lmdb.open(str(tmp_path), max_dbs=4, map_size=1 << 26)
    first, second = (SortedRuns(env, env.open_db(b"t"), 32, 4, 6, rows_in_memory=rows_in_memory) for _ in range(2))
    keys = np.arange(100, 1100, 10, dtype=np.uint64)
    with env.begin(write=True) as txn:
        first.insert(txn, keys, np.arange(len(keys), dtype=np.uint64))
    txn = env.begin(write=True)
    first.insert(txn, np.array([5, 6], dtype=np.uint64), np.array([900, 901], dtype=np.uint64))
    txn.abort()
    with env.begin(write=True) as txn:
        second.insert(txn, np.array([7, 8], dtype=np.uint64), np.array([700, 701], dtype=np.uint64))
    with env.begin() as txn:
        owners, values = first.read(txn, np.array([5, 6, 7, 8, 100], dtype=np.uint64))
        assert (owners.tolist(), values.tolist()) == ([2, 3, 4], [700, 701, 0])
        assert first.rows(txn)[0].tolist() == [7, 8, *keys.tolist()]
    env.close()


@pytest.mark.parametrize(("key_bytes", "value_bytes"), [(1, 3), (2, 6), (3, 5), (4, 6), (8, 8)])
def test_runs_are_searched_in_place_and_through_the_transaction_that_wrote_them_alike(
    tmp_path: Path, key_bytes: int, value_bytes: int
) -> None:
    # A brute-force list of rows as the oracle. Keys of every width, hot keys whose rows span many of the
    # directory's windows, probes below, between and above the stored keys; each read twice: in the write
    # transaction that just wrote a run (which the mapped snapshot does not hold yet), and after its commit.
    rng = np.random.default_rng(key_bytes)
    env = lmdb.open(str(tmp_path), max_dbs=4, map_size=1 << 28)
    table = SortedRuns(env, env.open_db(b"t"), 8 * key_bytes, key_bytes, value_bytes)
    top = 2 ** (8 * key_bytes) - 1
    hot = rng.integers(1, top, 3, dtype=np.uint64, endpoint=True)
    stored_keys, stored_values = np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    for size in [1, 700, 5, 2_000, 64, 65, 300, 1_500]:
        keys = np.where(rng.random(size) < 0.3, rng.choice(hot, size), rng.integers(1, top, size, dtype=np.uint64))
        keys = np.sort(keys.astype(np.uint64))
        values = rng.integers(0, 2 ** (8 * value_bytes) - 1, size, dtype=np.uint64, endpoint=True)
        stored_keys, stored_values = np.concatenate([stored_keys, keys]), np.concatenate([stored_values, values])
        probes = np.unique(
            np.concatenate(
                [hot, stored_keys[::3], stored_keys[::5] + np.uint64(1), rng.integers(0, top, 200, dtype=np.uint64)]
            )
        )
        probes = np.unique(np.concatenate([probes, np.array([0, top], dtype=np.uint64)]))
        expected = sorted(
            (key, value)
            for key, value in zip(stored_keys.tolist(), stored_values.tolist(), strict=True)
            if key in set(probes.tolist())
        )
        with env.begin(write=True) as txn:
            table.insert(txn, keys, values)
            owners, found = table.read(txn, probes)
            assert sorted(zip(probes[owners].tolist(), found.tolist(), strict=True)) == expected
        with env.begin() as txn:
            owners, found = table.read(txn, probes)
        assert owners.tolist() == sorted(owners.tolist())
        assert sorted(zip(probes[owners].tolist(), found.tolist(), strict=True)) == expected
    env.close()


def test_a_reader_whose_runs_a_later_commit_merged_away_still_reads_its_own(tmp_path: Path) -> None:
    # A read transaction sees the runs of its snapshot; the runs are searched through a newer one, where a merge
    # committed meanwhile has dropped them (and a new run took a number after theirs): read through its own.
    env = lmdb.open(str(tmp_path), max_dbs=4, map_size=1 << 26)
    table = SortedRuns(env, env.open_db(b"t"), 32, 4, 6)
    for batch in range(3):
        keys = np.arange(batch, 3_000, 3, dtype=np.uint64)
        with env.begin(write=True) as txn:
            table.insert(txn, keys, keys + np.uint64(10 * batch))
    probes = np.array([0, 1, 2, 4, 2_999, 5_000], dtype=np.uint64)
    with env.begin() as before:
        assert len(table._catalog(before)[1]) == 3
        with env.begin(write=True) as txn:
            table.insert(txn, np.array([1, 2], dtype=np.uint64), np.array([77, 78], dtype=np.uint64))
            assert len(table._catalog(txn)[1]) == 1  # the four runs merged into one
        owners, values = table.read(before, probes)
        assert (owners.tolist(), values.tolist()) == ([0, 1, 2, 3, 4], [0, 11, 22, 14, 2_999 + 20])
    with env.begin() as after:
        owners, values = table.read(after, probes)
    assert (owners.tolist(), values.tolist()) == ([0, 1, 1, 2, 2, 3, 4], [0, 11, 77, 22, 78, 14, 2_999 + 20])
    env.close()
