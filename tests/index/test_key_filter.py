"""The key filter: no added key is ever reported absent; the index trusts it only for the state it was built
for, so lookups stay exact across batches, aborted batches, growth and other writers."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from streamdedup.decide import Deduplicator, open_index
from streamdedup.document import Document
from streamdedup.index import IndexStorageError, SegmentIndex
from streamdedup.index import key_filter as key_filter_module
from streamdedup.index.cached import KEY_FILTER_FILE
from streamdedup.index.key_filter import BITS_PER_ID, BITS_PER_KEY, MIN_CAPACITY, KeyFilter
from streamdedup.index.plan import make_segment_plan
from streamdedup.index.store import id_hashes, keys_of_ids
from streamdedup.quality.natural import load_natural
from streamdedup.settings import load_settings
from streamdedup.signature import Signatures
from tests.index.test_segment import ROOT, _brute, _clustered, _flip, _random


def test_added_keys_are_always_present_and_most_absent_keys_are_not() -> None:
    rng = np.random.default_rng(1)
    key_filter = KeyFilter([32, 32, 32], capacity=MIN_CAPACITY, covers=0)
    added = rng.integers(0, 2**32, size=(3, MIN_CAPACITY), dtype=np.uint64)
    for part in np.array_split(np.arange(MIN_CAPACITY), 7):
        key_filter.add(added[:, part], added[0, part])
    for table in range(3):
        assert key_filter.may_contain(table, added[table]).all()
    absent = rng.integers(0, 2**32, size=200_000, dtype=np.uint64)
    absent = absent[~np.isin(absent, added[0])]
    false_positives = key_filter.may_contain(0, absent).mean()
    # At capacity: 1 - e^(-1/16) = 6.1 % of absent keys hash onto a set bit.
    assert abs(false_positives - (1 - np.exp(-1 / BITS_PER_KEY))) < 0.01
    # A key added to one table says nothing about another table.
    assert key_filter.may_contain(1, added[0]).mean() < 0.1


def test_added_ids_are_always_present_and_most_absent_ids_are_not() -> None:
    key_filter = KeyFilter([16, 16], capacity=MIN_CAPACITY, covers=0)
    added = [f"doc-{i}".encode() for i in range(MIN_CAPACITY)]
    key_filter.add(np.zeros((2, 0), np.uint64), id_hashes(added))
    assert key_filter.may_hold_ids(id_hashes(added)).all()
    absent = [f"doc-{i}".encode() for i in range(MIN_CAPACITY, 3 * MIN_CAPACITY)]
    # Three bits an id, all set for about (1 - e^(-3/128))^3 = 1 in 80,000 absent ids at capacity.
    assert key_filter.may_hold_ids(id_hashes(absent)).sum() <= 10
    # The tables' bitmaps stay clear: ids and keys do not share bits.
    assert not key_filter.may_contain(0, np.arange(2**16, dtype=np.uint64)).any()


def test_ids_pass_as_three_bits_an_id_predict() -> None:
    key_filter = KeyFilter([16, 16], capacity=MIN_CAPACITY, covers=0)
    # Eight bits an id, sixteen times the capacity: all three set for (1 - e^(-3/8))^3 = 2.7 % of absent ids.
    overfill = 16 * MIN_CAPACITY
    key_filter.add(np.zeros((2, 0), np.uint64), id_hashes([f"doc-{i}".encode() for i in range(overfill)]))
    absent = [f"doc-{i}".encode() for i in range(overfill, overfill + 2 * MIN_CAPACITY)]
    expected = (1 - np.exp(-3 * overfill / (BITS_PER_ID * MIN_CAPACITY))) ** 3
    assert abs(key_filter.may_hold_ids(id_hashes(absent)).mean() - expected) < 0.003


def test_id_hashes_mix_every_byte_hashed_and_the_length() -> None:
    ids = [b"", b"a", b"a\x00", b"ab", b"ba", b"x" * 63 + b"y", b"x" * 64, b"x" * 65]
    hashes = id_hashes(ids)
    assert len(set(hashes.tolist())) == len(ids)
    # One id hashes alike alone or among others of any width.
    assert [int(id_hashes([i])[0]) for i in ids] == hashes.tolist()
    # Beyond the bytes hashed, ids of one length share a hash: a shared filter bit, never a lost id.
    assert id_hashes([b"x" * 64 + b"z"])[0] == id_hashes([b"x" * 64 + b"w"])[0]
    assert id_hashes([]).dtype == np.uint64 and len(id_hashes([])) == 0


def test_stored_ids_are_found_through_the_filter_whatever_its_history(tmp_path: Path) -> None:
    plan, stored, ids = _plan_and_data(400, 11)
    asked = ids + [f"new-{i}" for i in range(400)] + ["d" + "7" * 600]  # one id keyed by its digest

    def found(index: SegmentIndex) -> list[str]:
        at, _ = index.entries_with_ids(asked)
        return [asked[i] for i in at]

    with SegmentIndex(tmp_path, 128, 3, plan=plan) as index:
        index.add(ids[:200], stored[:200])
        assert found(index) == ids[:200]  # the filter is built from the stored entries here
        key_filter = index._cached.key_filter
        assert key_filter is not None
        keys = keys_of_ids([x.encode() for x in asked[400:]])
        assert key_filter.may_hold_ids(id_hashes(keys)).mean() < 0.1
        index.add([*ids[200:300], asked[-1]], stored[200:301])
        assert found(index) == [*ids[:300], asked[-1]]  # and marked as batches add ids
    with SegmentIndex(tmp_path, 128, 3, plan=plan) as index:
        _refuse_rebuild(index)
        assert found(index) == [*ids[:300], asked[-1]]  # loaded as saved
        # A re-added id replaces its entry: found once, through the filter.
        index.add(["d5"], stored[301:302])
        assert found(index) == [*ids[:300], asked[-1]]
        assert index.query(stored[301:302])[0][0] == ("d5", 0)
        assert ("d5", 0) not in index.query(stored[5:6])[0]


def test_narrow_keys_get_a_bit_each_and_no_false_positive() -> None:
    key_filter = KeyFilter([16, 16], capacity=10, covers=0)
    key_filter.add(np.array([[0, 7, 65535], [1, 2, 3]], dtype=np.uint64), np.zeros(0, np.uint64))
    everything = np.arange(2**16, dtype=np.uint64)
    assert np.flatnonzero(key_filter.may_contain(0, everything)).tolist() == [0, 7, 65535]
    assert np.flatnonzero(key_filter.may_contain(1, everything)).tolist() == [1, 2, 3]
    # A table per key: each key asked of its own table.
    tables = np.array([0, 1, 0, 1, 1])
    asked = np.array([7, 7, 3, 3, 65535], dtype=np.uint64)
    assert key_filter.may_contain(tables, asked).tolist() == [True, False, False, True, False]


def test_keys_sharing_bytes_in_one_batch_all_get_their_bits() -> None:
    rng = np.random.default_rng(4)
    key_filter = KeyFilter([16, 16], capacity=10, covers=0)
    # Dense, with repeats: most bytes take several bits, some the same bit more than once, in one call.
    added = rng.integers(0, 2**10, size=(2, 3_000), dtype=np.uint64)
    key_filter.add(added, added[0])
    everything = np.arange(2**16, dtype=np.uint64)
    for table in range(2):
        assert np.flatnonzero(key_filter.may_contain(table, everything)).tolist() == np.unique(added[table]).tolist()


def test_bitmaps_grow_with_capacity_up_to_the_memory_cap_and_no_further() -> None:
    small, large = KeyFilter([32] * 32, 1_000, 0), KeyFilter([32] * 32, 100_000_000, 0)
    assert small.slot_bits == 20 and small.outgrown(2 * MIN_CAPACITY) and not small.outgrown(MIN_CAPACITY)
    # 32 tables share MAX_BYTES: 2**25 bits each, whatever the capacity asked; a larger index gains nothing
    # from a rebuild, so none is asked for.
    assert large.slot_bits == 25 and not large.outgrown(10**9)
    narrow = KeyFilter([16, 16], 10**9, 0)
    assert narrow.slot_bits == 16 and not narrow.outgrown(10**10)


def test_lookups_between_batches_stay_exact_and_use_the_filter(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    stored = _clustered(900, 2, 3, rng)
    ids = [f"d{i}" for i in range(len(stored))]
    # 32-bit segment keys: hashed into bitmaps; radius 3 under four segments is exact (pigeonhole).
    plan = make_segment_plan(128, 4, 3)
    with SegmentIndex(tmp_path, 128, 3, plan=plan, expected_entries=1000) as index:
        for first in range(0, len(stored), 100):
            index.add(ids[first : first + 100], stored[first : first + 100])
            queries = np.concatenate(
                [_flip(stored[rng.integers(0, first + 100, 20)], rng.integers(0, 5, 20), rng), _random(5, 2, rng)]
            )
            assert index.query(queries) == _brute(stored[: first + 100], ids[: first + 100], queries, 3)
            # Built once at the first lookup, then carried along by the index's own batches.
            assert index._cached.key_filter is not None and index._cached.key_filter.covers == first // 100 + 1


def test_a_filter_that_would_pass_every_key_is_dropped_and_lookups_stay_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    stored = _clustered(600, 2, 6, rng)
    ids = [f"d{i}" for i in range(len(stored))]
    with SegmentIndex(tmp_path, 128, 6, expected_entries=1000) as index:
        assert max(index.plan.key_bits) == 8  # 256 keys a table: most are taken after ~180 entries
        for first in range(0, len(stored), 100):
            index.add(ids[first : first + 100], stored[first : first + 100])
            assert index.query(stored[: first + 100]) == _brute(
                stored[: first + 100], ids[: first + 100], stored[: first + 100], 6
            )
            assert (index._cached.key_filter is not None) == (first + 100 <= 256 * np.log(2))


def test_an_aborted_batch_leaves_the_filter_trusted_and_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    fps = _random(20_000, 1, rng)
    limit = 2 * 1024 * 1024
    with SegmentIndex(tmp_path, 64, 3, expected_entries=20_000, map_size=limit, max_map_size=limit) as index:
        index.add([f"c{i}" for i in range(100)], fps[:100])
        assert index.query(fps[:1]) == [[("c0", 0)]]
        built = index._cached.key_filter
        # The batch fails inside its transaction, after its keys went into the filter.
        with pytest.raises(IndexStorageError, match="max_map_size"):
            index.add([f"c{i}" for i in range(100, 20_000)], fps[100:])
        assert index.query(fps[[0, 99, 100, 19_999]]) == [[("c0", 0)], [("c99", 0)], [], []]
        assert index._cached.key_filter is built and built.covers == 1
        index.add(["late"], fps[100:101])
        assert index.query(fps[[0, 100, 101]]) == [[("c0", 0)], [("late", 0)], []]
        assert index._cached.key_filter is built and built.covers == 2


_OTHER_WRITER = """
import sys
import numpy as np
from streamdedup.index import SegmentIndex
fps = np.frombuffer(bytes.fromhex(sys.argv[2]), dtype=np.uint64).reshape(-1, 2)
with SegmentIndex(sys.argv[1], 128, 6, expected_entries=1000) as index:
    index.add([f"{sys.argv[3]}-{i}" for i in range(len(fps))], fps)
"""


def test_what_another_writer_adds_is_found_by_a_writer_holding_a_filter(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    mine, theirs = _random(60, 2, rng), _random(60, 2, rng)
    with SegmentIndex(tmp_path, 128, 6, expected_entries=1000) as index:
        index.add([f"mine-{i}" for i in range(30)], mine[:30])
        assert index.query(theirs[:1]) == [[]]
        # The other process stages and merges its rows while this one holds a filter built before them.
        for step in range(2):
            part = theirs[30 * step : 30 * (step + 1)]
            subprocess.run(
                [sys.executable, "-c", _OTHER_WRITER, str(tmp_path), part.tobytes().hex(), f"theirs{step}"],
                check=True,
                cwd=ROOT,
                timeout=120,
            )
            assert index.query(part) == [[(f"theirs{step}-{i}", 0)] for i in range(30)]
        index.add([f"mine-{i}" for i in range(30, 60)], mine[30:])
        assert index.query(mine) == [[(f"mine-{i}", 0)] for i in range(60)]


def test_a_filter_outgrown_by_its_index_grows_with_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    plan = make_segment_plan(256, 8)
    stored = _random(3 * MIN_CAPACITY, 4, rng)
    ids = [f"d{i}" for i in range(len(stored))]
    with SegmentIndex(tmp_path, 256, 256, plan=plan, expected_entries=1000, sync=False) as index:
        index.add(ids[:10], stored[:10])
        index.query(stored[:1])
        assert index._cached.key_filter is not None
        first_capacity = index._cached.key_filter.capacity
        for first in range(10, len(stored), 20_000):
            index.add(ids[first : first + 20_000], stored[first : first + 20_000])
        probes = rng.integers(0, len(stored), 50)
        found = index.query(stored[probes])
        assert [hits[0] for hits in found] == [(ids[i], 0) for i in probes]
        assert index._cached.key_filter.capacity >= len(stored) > first_capacity


def _plan_and_data(n: int, seed: int) -> tuple[object, np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    return make_segment_plan(128, 4, 3), _clustered(n, 2, 3, rng), [f"d{i}" for i in range(n)]


def _refuse_rebuild(index: SegmentIndex) -> None:
    def rebuild(*args: object) -> None:
        raise AssertionError("the key filter was rebuilt")

    index._cached.fill_key_filter = rebuild  # type: ignore[method-assign]


def test_a_closing_writer_saves_its_filter_and_the_next_one_loads_it(tmp_path: Path) -> None:
    plan, stored, ids = _plan_and_data(400, 7)
    with SegmentIndex(tmp_path, 128, 3, plan=plan) as index:
        index.add(ids[:200], stored[:200])
        assert index.query(stored[:1])[0][0] == ("d0", 0)
        index.add(ids[200:300], stored[200:300])
    assert (tmp_path / KEY_FILTER_FILE).exists()
    with SegmentIndex(tmp_path, 128, 3, plan=plan) as index:
        _refuse_rebuild(index)
        assert index.query(stored[:300]) == _brute(stored[:300], ids[:300], stored[:300], 3)
        assert index._cached.key_filter is not None and index._cached.key_filter.covers == 2
        index.add(ids[300:], stored[300:])
        assert index.query(stored) == _brute(stored, ids, stored, 3)
    with SegmentIndex(tmp_path, 128, 3, plan=plan) as index:
        _refuse_rebuild(index)
        assert index.query(stored[350:]) == _brute(stored, ids, stored[350:], 3)


def test_a_filter_saved_with_one_bit_an_id_is_rebuilt_not_loaded(tmp_path: Path) -> None:
    plan, stored, ids = _plan_and_data(200, 12)
    with SegmentIndex(tmp_path, 128, 3, plan=plan) as index:
        index.add(ids, stored)
        assert index.query(stored[:1])[0][0] == ("d0", 0)
    # As older code saved it: no count of bits an id, one bit each (only the first of today's three).
    with np.load(tmp_path / KEY_FILTER_FILE) as saved:
        token, bitmaps = saved["token"], saved["bitmaps"]
    one_bit = KeyFilter([len(key) for key in plan.tables], MIN_CAPACITY, covers=0)
    slots = (id_hashes(keys_of_ids([i.encode() for i in ids])) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(
        64 - one_bit.id_slot_bits
    )
    id_bitmap = np.zeros_like(one_bit._id_bitmap)
    np.bitwise_or.at(
        id_bitmap[0], (slots >> np.uint64(3)).astype(np.intp), (1 << (slots & np.uint64(7))).astype(np.uint8)
    )
    with (tmp_path / KEY_FILTER_FILE).open("wb") as out:
        np.savez(out, token=token, bitmaps=bitmaps, ids=id_bitmap)
    rebuilt = []
    with SegmentIndex(tmp_path, 128, 3, plan=plan) as index:
        fill = index._cached.fill_key_filter

        def counted(*args: object) -> None:
            rebuilt.append(True)
            fill(*args)  # type: ignore[arg-type]

        index._cached.fill_key_filter = counted  # type: ignore[method-assign]
        at, records = index.entries_with_ids([*ids, "new"])
        assert rebuilt
        assert records.ids == ids and at.tolist() == list(range(200))


def test_a_saved_filter_is_not_loaded_after_another_writer_added_keys(tmp_path: Path) -> None:
    plan, stored, ids = _plan_and_data(100, 8)
    theirs = _random(30, 2, np.random.default_rng(9))
    with SegmentIndex(tmp_path, 128, 3, plan=plan) as index:
        index.add(ids, stored)
        assert index.query(stored[:1])[0][0] == ("d0", 0)
    # A writer that never looks up keeps no filter; its batch still voids the saved one.
    subprocess.run(
        [sys.executable, "-c", _SEGMENT_WRITER, str(tmp_path), theirs.tobytes().hex()],
        check=True,
        cwd=ROOT,
        timeout=120,
    )
    with SegmentIndex(tmp_path, 128, 3, plan=plan) as index:
        assert index.query(theirs) == [[(f"theirs-{i}", 0)] for i in range(30)]
    # Another index's saved filter (another token) in its place is not loaded: it lacks this index's keys.
    other, mine = tmp_path.parent / "other", _random(10, 2, np.random.default_rng(10))
    with SegmentIndex(other, 128, 3, plan=plan) as index:
        index.add([f"m{i}" for i in range(10)], mine)
        assert index.query(mine[:1]) == [[("m0", 0)]]
    (other / KEY_FILTER_FILE).write_bytes((tmp_path / KEY_FILTER_FILE).read_bytes())
    with SegmentIndex(other, 128, 3, plan=plan) as index:
        assert index.query(mine) == [[(f"m{i}", 0)] for i in range(10)]


_SEGMENT_WRITER = """
import sys
import numpy as np
from streamdedup.index import SegmentIndex
from streamdedup.index.plan import make_segment_plan
from streamdedup.index.store import id_hashes, keys_of_ids
fps = np.frombuffer(bytes.fromhex(sys.argv[2]), dtype=np.uint64).reshape(-1, 2)
with SegmentIndex(sys.argv[1], 128, 3, plan=make_segment_plan(128, 4, 3)) as index:
    index.add([f"theirs-{i}" for i in range(len(fps))], fps)
"""


def test_a_doubled_filter_keeps_every_key_and_lets_few_absent_keys_through() -> None:
    rng = np.random.default_rng(9)
    key_filter = KeyFilter([32, 32], capacity=MIN_CAPACITY, covers=3)
    added = rng.integers(0, 2**32, size=(2, MIN_CAPACITY), dtype=np.uint64)
    added_ids = rng.integers(0, 2**63, size=MIN_CAPACITY, dtype=np.uint64)
    key_filter.add(added, added_ids)
    doubled = key_filter.doubled()
    assert doubled is not None and doubled.covers == 3
    assert doubled.slot_bits == key_filter.slot_bits + 1 and doubled.capacity == 2 * key_filter.capacity
    # Each old bit became the two bits of the slots it splits into: no more, no fewer.
    old_bits = np.unpackbits(key_filter._bitmaps, axis=1, bitorder="little")
    new_bits = np.unpackbits(doubled._bitmaps, axis=1, bitorder="little")
    assert np.array_equal(new_bits, np.repeat(old_bits, 2, axis=1))
    old_id_bits = np.unpackbits(key_filter._id_bitmap, axis=1, bitorder="little")
    new_id_bits = np.unpackbits(doubled._id_bitmap, axis=1, bitorder="little")
    assert np.array_equal(new_id_bits, np.repeat(old_id_bits, 2, axis=1))
    more = rng.integers(0, 2**32, size=(2, MIN_CAPACITY), dtype=np.uint64)
    doubled.add(more, more[0])
    for table in range(2):
        assert doubled.may_contain(table, added[table]).all() and doubled.may_contain(table, more[table]).all()
    assert doubled.may_hold_ids(added_ids).all() and doubled.may_hold_ids(more[0]).all()
    absent = rng.integers(0, 2**32, size=200_000, dtype=np.uint64)
    absent = absent[~np.isin(absent, np.concatenate([added[0], more[0]]))]
    # At capacity after one doubling: the old keys hold two bits each, 3/32 of the bits are set (about 9 % pass).
    assert abs(doubled.may_contain(0, absent).mean() - (1 - np.exp(-3 / (2 * BITS_PER_KEY)))) < 0.01


def _split_bits(bitmaps: np.ndarray) -> np.ndarray:
    return np.repeat(np.unpackbits(bitmaps, axis=1, bitorder="little"), 2, axis=1)


def test_a_doubling_prepared_batch_by_batch_holds_every_key_and_leaves_nothing_to_split(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(11)
    key_filter = KeyFilter([32, 32], capacity=MIN_CAPACITY, covers=5)
    batch = MIN_CAPACITY // 64

    def add_batch() -> np.ndarray:
        keys = rng.integers(0, 2**32, size=(2, batch), dtype=np.uint64)
        key_filter.add(keys, keys[1])
        return keys

    added = [add_batch() for _ in range(7)]
    key_filter.prepare(MIN_CAPACITY // 2 - 1)  # below half the capacity: nothing is prepared
    assert key_filter._larger is None
    before = _split_bits(key_filter._bitmaps), _split_bits(key_filter._id_bitmap)
    # From half the capacity on, each batch splits its entries' share of the way to _READY_AT of the capacity;
    # keys added meanwhile go into both filters.
    span = (key_filter_module._READY_AT - key_filter_module._PREPARE_FROM) * MIN_CAPACITY
    table_bytes, id_bytes = key_filter._bitmaps.size, key_filter._id_bitmap.size
    split_before = 0
    for batch_number in range(1, int(span) // batch + 2):
        key_filter.prepare(MIN_CAPACITY // 2 + batch_number * batch)
        added.append(add_batch())
        larger = key_filter._larger
        assert larger is not None
        share = min(1.0, batch_number * batch / span)
        split_tables, split_ids = key_filter._split_bytes
        assert split_tables == 2 * math.ceil(share * table_bytes / 2) and split_ids == 2 * math.ceil(
            share * id_bytes / 2
        )
        # Each batch splits about as much, and what is not split yet is not written (not even touched) in the
        # larger bitmaps, the tables' end to end.
        assert split_tables - split_before <= 2 * math.ceil(batch / span * table_bytes / 2) + 2
        split_before = split_tables
        flat = larger._bitmaps.reshape(-1)
        assert not flat[2 * split_tables :].any() and flat[: 2 * split_tables].any()
        assert not larger._id_bitmap[:, 2 * split_ids :].any() and larger._id_bitmap[:, : 2 * split_ids].any()
    assert key_filter._split_bytes == (table_bytes, id_bytes)
    after = _split_bits(key_filter._bitmaps), _split_bits(key_filter._id_bitmap)
    split = key_filter_module._split_slots
    monkeypatch.setattr(key_filter_module, "_split_slots", mock_split := mock.Mock(side_effect=split))
    doubled = key_filter.doubled()
    assert doubled is not None and mock_split.call_count == 0  # all of it split ahead
    assert doubled.covers == 5 and doubled.slot_bits == key_filter.slot_bits + 1
    # Every key of every batch is in, and no bit is set that splitting the final bitmaps would not set.
    keys = np.concatenate(added, axis=1)
    for table in range(2):
        assert doubled.may_contain(table, keys[table]).all()
    assert doubled.may_hold_ids(keys[1]).all()
    for now, at_start, at_end in zip((doubled._bitmaps, doubled._id_bitmap), before, after, strict=True):
        bits = np.unpackbits(now, axis=1, bitorder="little").astype(bool)
        assert (bits >= at_start.astype(bool)).all() and (bits <= at_end.astype(bool)).all()
    # The next doubling starts afresh from the doubled filter.
    assert doubled._larger is None and key_filter._larger is None


def test_only_hashed_bitmaps_below_the_memory_cap_double() -> None:
    assert KeyFilter([16, 16], 10, 0).doubled() is None  # the keys themselves: nothing to split
    assert KeyFilter([32] * 32, 100_000_000, 0).doubled() is None  # at MAX_BYTES already
    # The next size would hold 21-bit keys themselves, which hashed slots cannot split into.
    hashed = KeyFilter([21], MIN_CAPACITY, 0)
    assert not hashed._identity and hashed.doubled() is None


def test_an_outgrown_filter_doubles_instead_of_reading_every_entry(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    plan = make_segment_plan(256, 8)
    stored = _random(MIN_CAPACITY + 20_000, 4, rng)
    ids = [f"d{i}" for i in range(len(stored))]
    with SegmentIndex(tmp_path, 256, 256, plan=plan, expected_entries=1000, sync=False) as index:
        index.add(ids[:10], stored[:10])
        index.query(stored[:1])
        first = index._cached.key_filter
        assert first is not None
        _refuse_rebuild(index)
        for start in range(10, len(stored), 20_000):
            index.add(ids[start : start + 20_000], stored[start : start + 20_000])
        probes = rng.integers(0, len(stored), 50)
        assert [hits[0] for hits in index.query(stored[probes])] == [(ids[i], 0) for i in probes]
        assert index._cached.key_filter is not None and index._cached.key_filter.capacity == 2 * first.capacity


def test_a_filter_doubles_its_tables_past_the_ids_cap_and_keeps_every_id(monkeypatch: pytest.MonkeyPatch) -> None:
    # The ids' bitmap at its cap from the start: 2**23 bits, as at MIN_CAPACITY.
    monkeypatch.setattr(key_filter_module, "MAX_ID_BYTES", 1 << 20)
    rng = np.random.default_rng(13)
    key_filter = KeyFilter([32, 32], capacity=MIN_CAPACITY, covers=0)
    added_ids = rng.integers(0, 2**63, size=MIN_CAPACITY, dtype=np.uint64)
    key_filter.add(np.zeros((2, 0), np.uint64), added_ids)
    doubled = key_filter.doubled()
    assert doubled is not None and doubled.slot_bits == key_filter.slot_bits + 1
    assert doubled.id_slot_bits == key_filter.id_slot_bits == 23
    assert np.array_equal(doubled._id_bitmap, key_filter._id_bitmap)
    more_ids = rng.integers(0, 2**63, size=MIN_CAPACITY, dtype=np.uint64)
    doubled.add(np.zeros((2, 0), np.uint64), more_ids)
    assert doubled.may_hold_ids(added_ids).all() and doubled.may_hold_ids(more_ids).all()
    # The one it was doubled from is not changed by it.
    assert key_filter.may_hold_ids(more_ids).mean() < 0.01


def test_a_rebuilt_filter_passes_the_keys_of_removed_entries_rows_that_lookups_count(tmp_path: Path) -> None:
    """A table keeps a removed entry's rows until its sweep, and lookups count them (``dedup.key_capacity``, the
    candidates they rank): a filter rebuilt when the saved one is lost (a crash) passes their keys too, so
    lookups find what they found through the filter kept since the rows were added, and without a filter."""
    settings = load_settings(None)
    settings = settings.model_copy(update={"index": settings.index.model_copy(update={"max_entries": 1000})})
    shipped, _ = load_natural()
    documents = [Document(doc.id, doc.text, float(row), ("t", 0, row)) for row, doc in enumerate(shipped[:4000])]
    later = [doc.text for doc in shipped[4000:5000]]

    def found(index: SegmentIndex, keys: Signatures) -> tuple[list[int], ...]:
        assert keys.keys is not None
        candidates = index.candidates(keys.fingerprints, keys=keys.keys, max_candidates=settings.dedup.max_candidates)
        assert candidates.held is not None
        return (
            candidates.rows.tolist(),
            candidates.entries.tolist(),
            candidates.shared.tolist(),
            candidates.held.counts.ravel().tolist(),
        )

    path = tmp_path / "index"
    with open_index(settings, path) as index:
        dedup = Deduplicator(settings, index)
        for start in range(0, len(documents), 500):
            dedup.decide(documents[start : start + 500], source_offsets={("t", 0): start + 500})
        assert index.stats()["unswept_removals"] > 0
        keys = dedup.signer.keyed(dedup.signer.sign(later), estimate=False)
        kept_running = found(index, keys)
    (path / KEY_FILTER_FILE).unlink()
    with open_index(settings, path) as index:
        assert found(index, keys) == kept_running
        assert index._cached.key_filter is not None and index._cached.key_filter.covers == len(documents) // 500
    with SegmentIndex(path, None, None, payload_bytes=None, readonly=True, key_capacity=32) as reader:
        assert found(reader, keys) == kept_running
