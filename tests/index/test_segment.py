from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lmdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamdedup.index import (
    EntryRecords,
    IndexStorageError,
    PlanError,
    SearchResult,
    SegmentIndex,
    make_plan,
    table_keys,
)
from streamdedup.index.format import ENTRY_KEY_BYTES, FORMAT_VERSION
from streamdedup.index.keys import HeldRows, TableKeys
from streamdedup.index.plan import make_segment_plan
from streamdedup.index.writes import CLOCK_WINDOW, REWRITE_ROUNDS
from tests.index import crash_writer

ROOT = Path(__file__).resolve().parents[2]


def _search_records(index: SegmentIndex, queries: np.ndarray) -> tuple[SearchResult, EntryRecords]:
    """``search``, and the records of what it found, row for row (every one still stored)."""
    result = index.search(queries)
    present, records = index.records_of(result.entries)
    assert present.tolist() == list(range(len(result)))
    return result, records


def _random(n: int, words: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 2**64 - 1, size=(n, words), dtype=np.uint64, endpoint=True)


def _flip(fps: np.ndarray, distance: np.ndarray | int, rng: np.random.Generator) -> np.ndarray:
    """Copies of ``fps`` with ``distance`` (per row or for all) distinct random bits flipped."""
    bits = fps.shape[1] * 64
    distance = np.broadcast_to(np.asarray(distance), (len(fps),))
    out = fps.copy()
    order = np.argsort(rng.random((len(fps), bits)), axis=1)
    for column in range(int(distance.max(initial=0))):
        rows = np.flatnonzero(distance > column)
        pos = order[rows, column]
        out[rows, pos // 64] ^= np.left_shift(np.uint64(1), (63 - pos % 64).astype(np.uint64))
    return out


def _clustered(n: int, words: int, radius: int, rng: np.random.Generator) -> np.ndarray:
    """Many near copies (0 .. radius + 2 bits off) of a few centres."""
    centres = _random(max(1, n // 25), words, rng)
    picks = centres[rng.integers(0, len(centres), n)]
    return _flip(picks, rng.integers(0, radius + 3, n), rng)


def _brute(stored: np.ndarray, ids: list[str], queries: np.ndarray, radius: int) -> list[list[tuple[str, int]]]:
    """The oracle: a full popcount scan, nearest first, ties in insertion order."""
    distances = np.bitwise_count(queries[:, None, :] ^ stored[None, :, :]).sum(axis=2)
    out = []
    for row in distances:
        hits = np.flatnonzero(row <= radius)
        hits = hits[np.lexsort((hits, row[hits]))]
        out.append([(ids[i], int(row[i])) for i in hits])
    return out


RADII = {64: 4, 128: 6, 256: 8}


@settings(max_examples=45, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    width=st.sampled_from([64, 128, 256]),
    radius_share=st.floats(0, 1),
    n=st.integers(1, 600),
    clustered=st.booleans(),
    batches=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_exact_plans_return_exactly_the_brute_force_answer(
    width: int, radius_share: float, n: int, clustered: bool, batches: int, seed: int
) -> None:
    radius = round(radius_share * RADII[width])
    words = width // 64
    rng = np.random.default_rng(seed)
    stored = _clustered(n, words, radius, rng) if clustered else _random(n, words, rng)
    ids = [f"doc{i}" for i in range(n)]
    queries = np.concatenate(
        [
            _flip(stored[rng.integers(0, n, 40)], rng.integers(0, radius + 3, 40), rng),
            _random(20, words, rng),
        ]
    )
    with tempfile.TemporaryDirectory() as tmp:
        with SegmentIndex(tmp, width, radius, expected_entries=max(n, 100)) as index:
            assert index.plan.kind == "exact"
            for part in np.array_split(np.arange(n), batches):
                index.add([ids[i] for i in part], stored[part])
            assert len(index) == n
            expected = _brute(stored, ids, queries, radius)
            assert index.query(queries) == expected
            flat = index.search(queries)
            assert flat.rows.tolist() == [row for row, hits in enumerate(expected) for _ in hits]
            assert flat.distances.tolist() == [d for hits in expected for _, d in hits]
            assert _search_records(index, queries)[1].ids == [i for hits in expected for i, _ in hits]
            earlier, later, distances = table_keys(index.plan, stored).pairs(stored)
            pairs = np.bitwise_count(stored[:, None, :] ^ stored[None, :, :]).sum(axis=2)
            first, second = np.nonzero(np.triu(pairs <= radius, k=1))
            assert (earlier.tolist(), later.tolist(), distances.tolist()) == (
                first.tolist(),
                second.tolist(),
                pairs[first, second].tolist(),
            )


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    width=st.sampled_from([64, 128]),
    batches=st.integers(1, 14),
    removals=st.integers(0, 12),
    seed=st.integers(0, 2**32 - 1),
)
def test_staged_and_merged_rows_answer_exactly_across_batches_removals_and_reopening(
    width: int, batches: int, removals: int, seed: int
) -> None:
    # Rows are staged and merged into one table per batch: more batches than tables, removals of staged and of
    # merged rows alike, a reader and a reopened index must all give the brute-force answer.
    radius = RADII[width] // 2
    words = width // 64
    rng = np.random.default_rng(seed)
    n = 30 * batches
    stored = _clustered(n, words, radius, rng)
    ids = [f"doc{i}" for i in range(n)]
    queries = np.concatenate(
        [_flip(stored[rng.integers(0, n, 30)], rng.integers(0, radius + 2, 30), rng), _random(5, words, rng)]
    )
    live: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        with SegmentIndex(tmp, width, radius, expected_entries=1000) as index:
            for part in np.array_split(np.arange(n), batches):
                index.add([ids[i] for i in part], stored[part])
                live.extend(part.tolist())
                doomed = set(rng.choice(live, size=min(removals, len(live)), replace=False).tolist())
                assert index.remove([ids[i] for i in doomed]) == len(doomed)
                live = [i for i in live if i not in doomed]
            expected = _brute(stored[live], [ids[i] for i in live], queries, radius)
            assert index.query(queries) == expected
        with SegmentIndex(tmp, None, None, payload_bytes=None, readonly=True) as reader:
            assert reader.query(queries) == expected
        with SegmentIndex(tmp, width, radius) as reopened:
            assert reopened.query(queries) == expected
            reopened.remove([ids[i] for i in live])
            # Removing every entry removes every table row, staged or merged: nothing is left behind.
            assert reopened.stats()["table_bytes"] == 0
            assert reopened.query(queries) == [[] for _ in queries]


@pytest.mark.parametrize("distance", [6, 10, 14])
def test_sampled_plan_recall_measured_through_the_index_matches_the_computed_recall(
    tmp_path: Path, distance: int
) -> None:
    plan = make_plan(128, 14, 20_000, max_tables=3, max_candidates=64)
    assert plan.kind == "sampled"
    rng = np.random.default_rng(distance)
    n = 3000
    stored = _random(n, 2, rng)
    with SegmentIndex(tmp_path, 128, 14, plan=plan) as index:
        index.add([f"d{i}" for i in range(n)], stored)
        results = index.query(_flip(stored, distance, rng))
    found = np.array([(f"d{i}", distance) in hits for i, hits in enumerate(results)])
    expected = plan.recall(distance)
    assert 0.0 < expected < 1.0 or distance == 6
    assert abs(found.mean() - expected) <= 4 * math.sqrt(expected * (1 - expected) / n) + 1e-9
    # Nothing outside the radius or at a wrong distance is ever reported.
    assert all(d <= 14 for hits in results for _, d in hits)


def test_readding_an_id_replaces_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    fps = _random(3, 1, rng)
    moved = _random(1, 1, rng)
    with SegmentIndex(tmp_path, 64, 3, expected_entries=1000) as index:
        index.add(["a", "b", "c"], fps)
        index.add(["a"], fps[:1])
        assert len(index) == 3
        index.add(["b"], moved)
        assert len(index) == 3
        assert index.query(fps[1:2]) == [[]]
        assert index.query(moved) == [[("b", 0)]]
        # Two ids on one fingerprint: removing one keeps the other findable.
        index.add(["twin"], fps[2:3])
        assert index.query(fps[2:3]) == [[("c", 0), ("twin", 0)]]
        assert index.remove(["c", "unknown"]) == 1
        assert index.query(fps[2:3]) == [[("twin", 0)]]
        assert index.remove(["twin"]) == 1
        assert index.query(fps[2:3]) == [[]]
        assert len(index) == 2


def test_expiry_by_event_time_drops_whole_old_buckets_and_min_time_hides_the_rest(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    fps = _random(11, 1, rng)
    times = np.array([0.0, 50.0, 120.0, 150.0, 250.0] + [260.0] * 6)
    with SegmentIndex(tmp_path, 64, 3, expected_entries=1000, max_age=100.0, time_bucket=100.0) as index:
        index.add([f"t{i}" for i in range(11)], fps, times=times)
        # The clock (the median time of the latest entries) is 260, the cutoff 160: bucket [0, 100) is gone;
        # 120 and 150 wait for their bucket.
        assert index.stats()["clock"] == 260.0
        assert len(index) == 9
        assert index.query(fps[:2]) == [[], []]
        assert index.query(fps[2:3], min_time=160.0) == [[]]
        assert index.query(fps[2:3]) == [[("t2", 0)]]
        assert index.expire(300.0) == 2
        assert [len(hits) for hits in index.query(fps)] == [0, 0, 0, 0] + [1] * 7


def test_entries_stamped_far_ahead_do_not_move_the_expiry_clock(tmp_path: Path) -> None:
    rng = np.random.default_rng(15)
    fps = _random(8, 1, rng)
    with SegmentIndex(tmp_path, 64, 3, expected_entries=1000, max_age=100.0, time_bucket=10.0) as index:
        index.add(["a", "b", "c"], fps[:3], times=[1000.0, 1001.0, 1002.0])
        # A producer's clock ten years ahead, alone in its batch and then beside others: nothing expires.
        index.add(["future"], fps[3:4], times=[1000.0 + 3.2e8])
        index.add(["d", "e", "future2", "f"], fps[4:], times=[1003.0, 1004.0, 2.0e9, 1005.0])
        assert len(index) == 8 and index.stats()["clock"] == 1003.5
        assert [hits for hits in index.query(fps[:3])] == [[("a", 0)], [("b", 0)], [("c", 0)]]
        # The window holds the latest CLOCK_WINDOW times: when most of them move on, so does the clock.
        later = _random(CLOCK_WINDOW, 1, rng)
        index.add([f"l{i}" for i in range(CLOCK_WINDOW)], later, times=np.full(CLOCK_WINDOW, 5000.0))
        assert index.stats()["clock"] == 5000.0
        assert index.query(fps[:3]) == [[], [], []]


def test_max_entries_evicts_the_oldest(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    fps = _random(30, 1, rng)
    with SegmentIndex(tmp_path, 64, 3, expected_entries=1000, max_entries=10, time_bucket=1.0) as index:
        for start in range(0, 30, 5):
            index.add(
                [f"e{i}" for i in range(start, start + 5)],
                fps[start : start + 5],
                times=np.arange(start, start + 5, dtype=float),
            )
            assert len(index) == min(start + 5, 10)
        present = [bool(hits) for hits in index.query(fps)]
    assert present == [False] * 20 + [True] * 10


def test_origins_source_offsets_and_rollback(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    fps = _random(10, 1, rng)
    origins = [("in", i % 2, 100 + i) for i in range(10)]
    with SegmentIndex(tmp_path, 64, 3, expected_entries=1000, payload_bytes=4) as index:
        index.add(
            [f"o{i}" for i in range(10)],
            fps,
            origins=origins,
            payloads=[bytes([i] * 4) for i in range(10)],
            times=np.arange(10.0),
            source_offsets={("in", 0): 109, ("in", 1): 110},
        )
        assert index.source_offsets() == {("in", 0): 109, ("in", 1): 110}
        _, records = _search_records(index, fps[[3, 8]])
        assert records.ids == ["o3", "o8"]
        assert records.origins == [("in", 1, 103), ("in", 0, 108)]
        assert records.payloads.tolist() == [[3] * 4, [8] * 4]
        assert records.times.tolist() == [3.0, 8.0]
        # Kafka committed up to 104 on partition 0 and 103 on partition 1: later entries go.
        assert index.rollback({("in", 0): 104, ("in", 1): 103}) == 7
        assert index.source_offsets() == {("in", 0): 104, ("in", 1): 103}
        assert sorted(i for hits in index.query(fps) for i, _ in hits) == ["o0", "o1", "o2"]
        index.add([], np.zeros((0, 1), np.uint64), source_offsets={("in", 0): 120})
        assert index.source_offsets()[("in", 0)] == 120


def test_origins_of_several_topics_and_none_in_one_batch(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    fps = _random(6, 1, rng)
    origins = [("a", 0, 10), None, ("b", 2, 20), ("a", 1, 11), None, ("b", 2, 21)]
    with SegmentIndex(tmp_path, 64, 3, expected_entries=1000) as index:
        index.add([f"m{i}" for i in range(6)], fps, origins=origins)
        assert _search_records(index, fps)[1].origins == origins
        # Rolling topic b back from offset 21 removes exactly its last entry.
        assert index.rollback({("b", 2): 21}) == 1
        assert sorted(i for hits in index.query(fps) for i, _ in hits) == ["m0", "m1", "m2", "m3", "m4"]


def test_incompatible_open_is_a_clear_error_and_stored_settings_reopen(tmp_path: Path) -> None:
    with SegmentIndex(tmp_path, 64, 3, expected_entries=1000, payload_bytes=8) as index:
        index.add(["k"], np.array([[5]], dtype=np.uint64))
    for kwargs, word in [
        ({"bits": 128}, "bits 128"),
        ({"radius": 2}, "radius 2"),
        ({"payload_bytes": 0}, "payload_bytes"),
    ]:
        args = {"bits": 64, "radius": 3, "payload_bytes": 8} | kwargs
        with pytest.raises(PlanError, match=word):
            SegmentIndex(tmp_path, args["bits"], args["radius"], payload_bytes=args["payload_bytes"])
    with pytest.raises(PlanError, match="plan"):
        SegmentIndex(tmp_path, 64, 3, payload_bytes=8, plan=make_plan(64, 3, 10_000_000))
    with SegmentIndex(tmp_path, None, None, payload_bytes=None, readonly=True) as reader:
        assert (reader.bits, reader.radius, reader.payload_bytes, len(reader)) == (64, 3, 8, 1)
        with pytest.raises(PermissionError):
            reader.add(["x"], np.array([[1]], dtype=np.uint64))


def test_an_index_refuses_fingerprints_signed_another_way(tmp_path: Path) -> None:
    with SegmentIndex(tmp_path / "signed", 64, 3, expected_entries=1000, signing="scheme 2, settings a") as index:
        index.add(["k"], np.array([[5]], dtype=np.uint64))
    with pytest.raises(PlanError, match=r"signing scheme 2, settings b \(stored: scheme 2, settings a\)"):
        SegmentIndex(tmp_path / "signed", 64, 3, signing="scheme 2, settings b")
    with SegmentIndex(tmp_path / "signed", 64, 3, signing="scheme 2, settings a") as index:
        assert index.signing == "scheme 2, settings a" and len(index) == 1
    # Readers and maintenance that do not sign anything open it as it is.
    with SegmentIndex(tmp_path / "signed", None, None, payload_bytes=None, readonly=True) as reader:
        assert reader.signing == reader.stats()["signing"] == "scheme 2, settings a"
    # An index that recorded no signing (older code) cannot tell how its fingerprints were made.
    with SegmentIndex(tmp_path / "older", 64, 3, expected_entries=1000) as index:
        index.add(["k"], np.array([[5]], dtype=np.uint64))
    with pytest.raises(PlanError, match="none recorded, an older index") as refused:
        SegmentIndex(tmp_path / "older", 64, 3, signing="scheme 2, settings a")
    # The message says what to do: an index cannot be re-signed, only replaced.
    assert "point index.path at a new folder" in str(refused.value)


def _index_as_written_by(path: Path, reference: Path, **changes: object) -> None:
    """A new, empty index at ``path`` whose stored format is ``reference``'s with ``changes`` (None deletes a key),
    as older code wrote it: the index creates its databases as that format says when it first opens them."""
    env = lmdb.open(str(reference), max_dbs=64, subdir=True, readonly=True)
    try:
        with env.begin() as txn:
            stored = json.loads(txn.get(b"format", db=env.open_db(b"meta", txn=txn)))
    finally:
        env.close()
    for key, value in changes.items():
        if value is None:
            stored.pop(key, None)
        else:
            stored[key] = value
    env = lmdb.open(str(path), max_dbs=64, subdir=True)
    try:
        with env.begin(write=True) as txn:
            txn.put(b"format", json.dumps(stored, sort_keys=True).encode(), db=env.open_db(b"meta", txn=txn))
    finally:
        env.close()


def _format_version(path: Path, set_to: int | None = None) -> int:
    """The index format version stored in the meta database (first rewritten to ``set_to``, if given)."""
    env = lmdb.open(str(path), max_dbs=64, subdir=True)
    try:
        meta = env.open_db(b"meta")
        with env.begin(write=True) as txn:
            stored = json.loads(txn.get(b"format", db=meta))
            if set_to is not None:
                stored["version"] = set_to
                txn.put(b"format", json.dumps(stored, sort_keys=True).encode(), db=meta)
        return int(stored["version"])
    finally:
        env.close()


def test_a_format_1_index_is_read_and_upgraded_and_an_unknown_format_is_refused(tmp_path: Path) -> None:
    # Format 1 had no staged rows and dupsort tables (no layout recorded): it reads and grows as it was written.
    fps = _random(3, 1, np.random.default_rng(9))
    with SegmentIndex(tmp_path / "reference", 64, 3, expected_entries=1000):
        pass
    path = tmp_path / "old"
    _index_as_written_by(path, tmp_path / "reference", version=1, table_layout=None)
    with SegmentIndex(path, 64, 3):
        pass
    _format_version(path, set_to=1)
    with SegmentIndex(path, None, None, payload_bytes=None, readonly=True) as reader:
        assert len(reader) == 0
    assert _format_version(path) == 1  # a reader leaves it alone
    with SegmentIndex(path, 64, 3) as index:
        assert index.stats()["table_layout"] == "rows"
        index.add(["a", "b", "c"], fps)
    assert _format_version(path) == FORMAT_VERSION
    with SegmentIndex(path, None, None, payload_bytes=None, readonly=True) as reader:
        assert reader.query(fps) == [[("a", 0)], [("b", 0)], [("c", 0)]]
    _format_version(path, set_to=FORMAT_VERSION + 1)
    with pytest.raises(PlanError, match=f"index format {FORMAT_VERSION + 1}") as refused:
        SegmentIndex(path, 64, 3)
    assert "point index.path at a new folder" in str(refused.value)


def _chunk_runs(path: Path, widths: dict[str, tuple[int, int]]) -> None:
    """Store the sorted runs of the databases named in ``widths`` (key and value bytes) as formats 6-9 did, each
    run a series of LMDB values of 64 packed rows after its number, and mark the index as format 9."""
    from streamdedup.index import table as layout

    env = lmdb.open(str(path), max_dbs=64, subdir=True)
    try:
        with env.begin(write=True) as txn:
            for name, (key_bytes, value_bytes) in widths.items():
                db = env.open_db(name.encode(), txn=txn)
                runs = layout.SortedRuns(env, db, 8 * key_bytes, key_bytes, value_bytes)
                next_run, catalog = runs._catalog(txn)
                chunked = []
                for run in catalog:
                    number, stamp = int(run["run"]), int(run["stamp"])
                    keys, values = runs._run_rows(txn, run)
                    bitmap = txn.get(layout._part_key(number, layout._FILTER_PART), db=db)
                    runs._drop_run(txn, run)
                    packed, size = runs.join_rows(keys, values), 64 * (key_bytes + value_bytes)
                    chunks = [packed[start : start + size] for start in range(0, len(packed), size)]
                    parts = [(layout._part_key(number, i), chunk) for i, chunk in enumerate(chunks)]
                    directory = keys[::64].astype("<u8").tobytes()
                    parts.append((layout._part_key(number, layout._DIRECTORY_PART), directory))
                    parts.append((layout._part_key(number, layout._FILTER_PART), bitmap))
                    for key, value in parts:
                        txn.put(key, value, db=db)
                    chunked.append((number, stamp, int(run["rows"]), len(chunks), int(run["filter_slots"])))
                records = np.array(chunked, dtype=layout._CHUNKED_RUN)
                txn.put(layout._CATALOG, next_run.to_bytes(4, "little") + records.tobytes(), db=db)
    finally:
        env.close()
    _format_version(path, set_to=9)


def test_an_index_with_chunked_runs_is_rewritten_by_its_first_writer_and_answers_as_before(tmp_path: Path) -> None:
    # Formats 6-9 stored each sorted run (tables, ids, contents) in chunks of rows: the first process that opens
    # such an index to write rewrites every run whole, in the transaction that marks it as this format; a reader
    # is refused until then, with what to do.
    from streamdedup.index.plan import make_segment_plan

    rng = np.random.default_rng(5)
    bits, segments = 256, 16
    stored = _random(600, bits // 64, rng)
    stored[300:] = _flip(stored[:300], 6, rng)
    ids = [f"doc{i}" for i in range(len(stored))]
    with SegmentIndex(tmp_path, bits, bits, plan=make_segment_plan(bits, segments), payload_bytes=0) as index:
        for start in range(0, len(stored), 50):
            index.add(ids[start : start + 50], stored[start : start + 50])
        answers = index.query(stored)
        assert index.stats()["table_layout"] == "runs"
    assert sum(len(hits) for hits in answers) > len(stored)  # near copies found through the tables
    widths = {f"table-{t}": (2, ENTRY_KEY_BYTES) for t in range(segments)} | {
        name: (8, ENTRY_KEY_BYTES) for name in ("ids", "contents")
    }
    _chunk_runs(tmp_path, widths)
    with pytest.raises(PlanError, match="stores its sorted runs in chunks") as refused:
        SegmentIndex(tmp_path, None, None, payload_bytes=None, readonly=True)
    assert "open the index to write once" in str(refused.value)
    assert _format_version(tmp_path) == 9
    with SegmentIndex(tmp_path, None, None, payload_bytes=None) as index:
        assert index.query(stored) == answers
        assert index.remove(ids[::3]) == len(ids[::3])  # found through the id runs
    assert _format_version(tmp_path) == FORMAT_VERSION
    with SegmentIndex(tmp_path, None, None, payload_bytes=None, readonly=True) as reader:
        kept = [[hit for hit in hits if int(hit[0][3:]) % 3] for hits in answers]
        assert reader.query(stored) == kept


def test_bad_input_is_rejected_for_that_batch_only(tmp_path: Path) -> None:
    with SegmentIndex(tmp_path, 64, 3, expected_entries=1000, payload_bytes=2) as index:
        index.add(["ok"], np.array([[1]], dtype=np.uint64))
        for ids, fps, extra in [
            (["a"], np.array([[1, 2]], dtype=np.uint64), {}),
            (["a"], np.array([[1]], dtype=np.int64), {}),
            ([3], np.array([[1]], dtype=np.uint64), {}),
            ([""], np.array([[1]], dtype=np.uint64), {}),
            (["a", "b"], np.array([[1]], dtype=np.uint64), {}),
            (["a"], np.array([[1]], dtype=np.uint64), {"times": [float("nan")]}),
            (["a"], np.array([[1]], dtype=np.uint64), {"payloads": [b"toolong"]}),
        ]:
            with pytest.raises(ValueError):
                index.add(ids, fps, **extra)
        with pytest.raises(ValueError, match=r"rows \[1\] hold lone surrogates"):
            index.add(["fine", "half \ud83d"], np.array([[1], [2]], dtype=np.uint64))
        assert len(index) == 1
        long_id = "é" * 400
        far = np.array([[2**64 - 1]], dtype=np.uint64)
        index.add([long_id], far)
        assert index.query(far) == [[(long_id, 0)]]
        assert index.remove([long_id]) == 1


def test_map_grows_by_itself_and_a_map_at_its_limit_loses_nothing_committed(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    fps = _random(20_000, 1, rng)
    with SegmentIndex(tmp_path / "grow", 64, 3, expected_entries=20_000, map_size=64 * 1024) as index:
        index.add([f"g{i}" for i in range(20_000)], fps)
        stats = index.stats()
        assert stats["map_size"] > 64 * 1024
        # A 64-bit index of folds keeps no copy of its tables in memory.
        assert index.usage() == {
            **{key: stats[key] for key in ("entries", "disk_bytes", "map_size")},
            "mirrored_tables": 0,
            "mirror_bytes": 0,
        }
        assert index.usage()["entries"] == 20_000
        assert index.query(fps[:3]) == [[("g0", 0)], [("g1", 0)], [("g2", 0)]]
    limit = 2 * 1024 * 1024
    with SegmentIndex(tmp_path / "cap", 64, 3, expected_entries=20_000, map_size=limit, max_map_size=limit) as index:
        index.add([f"c{i}" for i in range(100)], fps[:100])
        with pytest.raises(IndexStorageError, match="max_map_size"):
            index.add([f"c{i}" for i in range(100, 20_000)], fps[100:])
        assert len(index) == 100
        assert index.query(fps[[0, 99, 100]]) == [[("c0", 0)], [("c99", 0)], []]


FULL_DISK_CHILD = """
import resource, signal, sys
import numpy as np
from streamdedup.index import IndexStorageError, SegmentIndex
path, limit = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
index = SegmentIndex(path, 64, 3, expected_entries=100_000)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
fps = np.random.default_rng(1).integers(0, 2**63, size=(100_000, 1), dtype=np.uint64)
try:
    index.add([f"big{i}" for i in range(100_000)], fps)
except IndexStorageError as exc:
    print("storage error:", exc)
"""


def test_a_full_disk_fails_that_batch_and_loses_nothing_committed(tmp_path: Path) -> None:
    fps = _random(51, 1, np.random.default_rng(9))
    with SegmentIndex(tmp_path, 64, 3, expected_entries=100_000) as index:
        index.add([f"s{i}" for i in range(50)], fps[:50])
    size = (tmp_path / "data.mdb").stat().st_size
    child = subprocess.run(
        [sys.executable, "-c", FULL_DISK_CHILD, str(tmp_path), str(size + 64 * 1024)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert child.returncode == 0, child.stderr
    assert "storage error" in child.stdout
    with SegmentIndex(tmp_path, 64, 3) as index:
        assert len(index) == 50
        assert index.query(fps[[0, 49]]) == [[("s0", 0)], [("s49", 0)]]
        assert index.query(fps[50:]) == [[]]


def _start_writer(path: Path, log: Path, kind: str = "folds") -> subprocess.Popen[str]:
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.index.crash_writer", str(path), str(log), kind],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "ready", writer.stderr.read() if writer.stderr else ""
    return writer


def _logged_batches(log: Path) -> list[int]:
    """The batch numbers the writers logged as committed, in order."""
    return [int(line) for line in log.read_text().split("\n")[:-1]] if log.exists() else []


def _wait_for_a_logged_batch(log: Path, after: int) -> None:
    """Until the writer has logged a batch numbered above ``after``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logged = _logged_batches(log)
        if logged and logged[-1] > after:
            return
        time.sleep(0.005)
    raise AssertionError(f"the writer logged no batch after {after} in 60 s")


def _check_committed(path: Path, log: Path, known: int = -1, kind: str = "folds") -> int:
    """The reopened index holds exactly the logged batches and the ``known`` committed ones, plus possibly the one
    in flight. A writer killed between a commit and its log line leaves that batch unlogged, and the next writer
    resumes after it: the last check's answer is known too."""
    logged = _logged_batches(log)
    with crash_writer.open_index(str(path), kind) as index:
        committed_through = index.source_offsets().get((crash_writer.TOPIC, 0), 0) // crash_writer.BATCH - 1
        last_known = max(logged[-1] if logged else -1, known)
        assert committed_through in (last_known, last_known + 1)
        kept = list(range(max(0, committed_through - crash_writer.KEEP_BATCHES + 1), committed_through + 1))
        assert len(index) == crash_writer.BATCH * len(kept)
        gone = list(range(max(0, committed_through - crash_writer.KEEP_BATCHES - 1), kept[0] if kept else 0))
        for number in kept + gone + [committed_through + 1]:
            ids, fps = crash_writer.batch(number, kind)
            hits = index.query(fps)
            present = [(own, 0) in found for own, found in zip(ids, hits, strict=True)]
            assert all(present) if number in kept else not any(present), number
    return committed_through


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["folds", "entries"])
def test_kill_minus_nine_at_random_moments_never_loses_or_invents_a_committed_batch(tmp_path: Path, kind: str) -> None:
    # Entry-valued tables are swept of evicted entries' rows while they merge, so kills land in sweeps too.
    # Every other writer is killed only after it has committed a batch of its own, so the kills land across many
    # batches however slowly writers start on a busy machine; the others die at any moment from their start.
    path, log = tmp_path / "index", tmp_path / "committed.log"
    shuffle = random.Random(11)
    progress = []
    for round_number in range(30):
        writer = _start_writer(path, log, kind)
        if round_number % 2:
            _wait_for_a_logged_batch(log, after=progress[-1])
        time.sleep(shuffle.uniform(0.0, 0.4))
        os.kill(writer.pid, signal.SIGKILL)
        writer.communicate(timeout=30)
        progress.append(_check_committed(path, log, progress[-1] if progress else -1, kind))
    assert progress == sorted(progress)
    assert progress[-1] >= 15


@pytest.mark.slow
def test_stats_from_another_process_while_a_writer_runs(tmp_path: Path) -> None:
    path, log = tmp_path / "index", tmp_path / "committed.log"
    writer = _start_writer(path, log)
    cli = Path(sys.executable).with_name("streamdedup")
    seen = []
    try:
        for _ in range(4):
            time.sleep(0.3)
            out = subprocess.run([str(cli), "index", "stats", str(path)], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            stats = json.loads(out.stdout)
            assert stats["plan"]["tables"] == 4
            seen.append(stats["source_offsets"].get("in:0", 0))
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.communicate(timeout=30)
    assert seen == sorted(seen) and seen[-1] > seen[0]
    _check_committed(path, log)


_WRITE_STEP = """
import sys
import numpy as np
from streamdedup.index import SegmentIndex
rng = np.random.default_rng(int(sys.argv[2]))
with SegmentIndex(sys.argv[1], 64, 3, expected_entries=1000) as index:
    index.add([f"s{sys.argv[2]}-{i}" for i in range(50)], rng.integers(0, 2**63, size=(50, 1), dtype=np.uint64))
    index.remove(sys.argv[3:])
"""


def test_a_long_lived_reader_sees_what_another_process_stages_merges_and_removes(tmp_path: Path) -> None:
    def write_step(step: int, *removed: str) -> np.ndarray:
        subprocess.run(
            [sys.executable, "-c", _WRITE_STEP, str(tmp_path), str(step), *removed], check=True, cwd=ROOT, timeout=120
        )
        return np.random.default_rng(step).integers(0, 2**63, size=(50, 1), dtype=np.uint64)

    first = write_step(1)
    with SegmentIndex(tmp_path, None, None, payload_bytes=None, readonly=True) as reader:
        assert reader.query(first[:2]) == [[("s1-0", 0)], [("s1-1", 0)]]
        # Each later step stages its batch and merges one table; the reader opened before them sees each.
        tables = reader.plan.tables
        for step in range(2, 7):
            fps = write_step(step, f"s1-{step}")
            # Three bits off, one in every table's key but table t's: found through table t alone, whether
            # its rows are staged or merged.
            for t in range(len(tables)):
                near = fps[:1].copy()
                for other in (u for u in range(len(tables)) if u != t):
                    near[0, 0] ^= np.uint64(1 << (63 - tables[other][0]))
                assert reader.query(near) == [[(f"s{step}-0", 3)]], (step, t)
            assert reader.query(first[step : step + 1]) == [[]]
        assert len(reader) == 50 * 6 - 5


# --- segment plans (segmented fingerprints) -----------------------------------------------------------------


def _segments(fps: np.ndarray, size: int) -> np.ndarray:
    """(n, segments) values of each fingerprint's segments, left to right."""
    per_word = 64 // size
    shifts = np.arange(per_word - 1, -1, -1, dtype=np.uint64) * np.uint64(size)
    mask = np.uint64((1 << size) - 1) if size < 64 else np.uint64(2**64 - 1)
    return ((fps[:, :, None] >> shifts) & mask).reshape(len(fps), -1)


# 16-bit keys sort packed with their row numbers; 64-bit keys leave no room and take the argsort.
@pytest.mark.parametrize(("bits", "segments"), [(256, 16), (512, 8)])
def test_segment_plan_finds_exactly_the_entries_sharing_a_keyed_segment(
    tmp_path: Path, bits: int, segments: int
) -> None:
    from streamdedup.index.plan import make_segment_plan

    rng = np.random.default_rng(5)
    size = bits // segments
    centres = rng.integers(0, 2**64 - 1, size=(20, bits // 64), dtype=np.uint64, endpoint=True)
    stored = centres[rng.integers(0, 20, 400)].copy()
    # Each copy keeps a random subset of its centre's segments and replaces the rest; some are zeroed (unkeyed).
    seg = _segments(stored, size)
    noise = rng.integers(0, (1 << size) - 1, size=seg.shape, dtype=np.uint64, endpoint=True)
    replace = rng.random(seg.shape) < 0.7
    seg = np.where(replace, noise, seg)
    seg[rng.random(seg.shape) < 0.2] = 0
    per_word = 64 // size
    shifts = np.arange(per_word - 1, -1, -1, dtype=np.uint64) * np.uint64(size)
    stored = np.bitwise_or.reduce(seg.reshape(len(seg), bits // 64, per_word) << shifts, axis=2)
    queries = stored[:60].copy()
    queries[:, 0] ^= np.uint64(1)
    plan = make_segment_plan(bits, segments)
    with SegmentIndex(tmp_path / "seg", bits, bits, plan=plan) as index:
        index.add([f"e{i}" for i in range(len(stored))], stored)
        found = index.query(queries)
        earlier, later, _ = table_keys(index.plan, stored).pairs(stored)
    qs, ss = _segments(queries, size), _segments(stored, size)
    for row, hits in enumerate(found):
        shares = ((qs[row] == ss) & (ss != 0)).any(axis=1)
        assert sorted(i for i, _ in hits) == sorted(f"e{i}" for i in np.flatnonzero(shares))
    shares_pair = ((ss[:, None, :] == ss[None, :, :]) & (ss[:, None, :] != 0)).any(axis=2)
    expected = {(a, b) for a, b in zip(*np.nonzero(np.triu(shares_pair, 1)), strict=True)}
    assert set(zip(earlier.tolist(), later.tolist(), strict=True)) == expected
    assert plan.recall(0) == 1.0 and plan.recall(segments - 1) == 1.0 and 0 < plan.recall(bits // 2) < 1


def test_a_table_rewrites_all_its_runs_only_in_its_own_rounds_of_merge_turns(tmp_path: Path) -> None:
    # Tables that grow alike reach a whole rewrite (every run merged into one) at the same turn count: each waits
    # for a round of its own, one in REWRITE_ROUNDS, so that their rewrites do not all land in one round.
    plan = make_segment_plan(256, 16)
    tables = len(plan.tables)
    rng = np.random.default_rng(8)
    rewrites = []
    with SegmentIndex(tmp_path / "seg", 256, 256, plan=plan) as index:
        store = index._store

        def oldest_runs() -> list[int | None]:
            with index.env.begin() as txn:
                return [
                    int(runs["run"][0]) if len(runs) else None for runs in (t._catalog(txn)[1] for t in store.tables)
                ]

        for turn in range(12 * tables):
            before = oldest_runs()
            index.add([f"t{turn}-{i}" for i in range(10)], _random(10, 4, rng))
            after = oldest_runs()
            changed = [t for t in range(tables) if before[t] is not None and after[t] != before[t]]
            # Only the table whose turn it was merges, and its oldest run changes only in a whole rewrite.
            assert changed in ([], [turn % tables])
            rewrites += [(turn // tables, table) for table in changed]
    assert len(rewrites) >= 2 * tables // REWRITE_ROUNDS
    assert all(turn_round % REWRITE_ROUNDS == table % REWRITE_ROUNDS for turn_round, table in rewrites)


def test_a_lookup_reaching_lmdb_that_matches_no_merged_and_no_staged_row_finds_nothing(tmp_path: Path) -> None:
    # Found by the kill -9 test: after a rollback the writer's key filter keeps the removed rows' bits, so a
    # probe can reach the tables and match nothing, merged or staged. A reader has no key filter: every probe
    # reaches the tables.
    from streamdedup.index.plan import make_segment_plan

    rng = np.random.default_rng(8)
    bits, segments = 256, 8
    stored = _random(50, bits // 64, rng)
    with SegmentIndex(tmp_path, bits, bits, plan=make_segment_plan(bits, segments)) as writer:
        writer.add([f"e{i}" for i in range(len(stored))], stored)
        assert writer.stats()["staged_rows"] > 0
    with SegmentIndex(tmp_path, None, None, payload_bytes=None, readonly=True) as reader:
        for unrelated in _random(5, bits // 64, rng):
            assert len(reader.search(unrelated[None, :])) == 0
            assert reader.query(unrelated[None, :]) == [[]]
        # Mixed with a stored one, only that one is found.
        found = reader.search(np.vstack([_random(1, bits // 64, rng), stored[7:8]]))
        assert found.rows.tolist() == [1] and found.distances.tolist() == [0]


@pytest.mark.parametrize(
    ("table_values", "table_layout", "entry_key_bytes", "records"),
    [
        ("entries", "runs", 6, "packed"),
        ("entries", "runs", 6, None),
        ("entries", "rows", None, None),
        ("folds", "rows", 6, None),
        ("folds", "buckets", 6, None),
    ],
)
def test_segment_tables_of_entries_and_of_folds_answer_alike_through_adds_and_removals(
    tmp_path: Path, table_values: str, table_layout: str, entry_key_bytes: int | None, records: str | None
) -> None:
    # A new wide index without a radius keys its tables to entries (6 bytes each, in sorted runs; formats up to 5
    # wrote 8 in dupsort rows) and packs its records (formats up to 6 wrote them at full width); one written by
    # format 2 holds folds (shared by entries with equal fingerprints) in dupsort rows and must go on working;
    # folds packed in buckets are what a fold-valued index is given from format 4 on, here through the same adds
    # and removals.
    from streamdedup.index.plan import make_segment_plan

    rng = np.random.default_rng(12)
    bits, segments, size = 256, 16, 16
    centres = rng.integers(0, 2**64 - 1, size=(15, bits // 64), dtype=np.uint64, endpoint=True)
    stored = centres[rng.integers(0, 15, 400)].copy()
    seg = _segments(stored, size)
    noise = rng.integers(1, (1 << size) - 1, size=seg.shape, dtype=np.uint64, endpoint=True)
    seg = np.where(rng.random(seg.shape) < 0.8, noise, seg)
    shifts = np.arange(3, -1, -1, dtype=np.uint64) * np.uint64(size)
    stored = np.bitwise_or.reduce(seg.reshape(len(seg), bits // 64, 4) << shifts, axis=2)
    stored[350:] = stored[:50]  # equal fingerprints under other ids
    seg = _segments(stored, size)
    ids = [f"e{i}" for i in range(len(stored))]
    path = tmp_path / "seg"
    with SegmentIndex(tmp_path / "reference", bits, bits, plan=make_segment_plan(bits, segments)) as reference:
        assert (reference.stats()["table_values"], reference.stats()["table_layout"]) == ("entries", "runs")
    _index_as_written_by(
        path,
        tmp_path / "reference",
        table_values=table_values,
        table_layout=table_layout,
        entry_key_bytes=entry_key_bytes,
        records=records,
    )

    def expected(alive: np.ndarray) -> list[list[str]]:
        shares = ((seg[:, None, :] == seg[None, alive, :]) & (seg[None, alive, :] != 0)).any(axis=2)
        return [sorted(ids[i] for i in alive[np.flatnonzero(row)]) for row in shares]

    with SegmentIndex(path, None, None, payload_bytes=None) as index:
        assert (index.stats()["table_values"], index.stats()["table_layout"]) == (table_values, table_layout)
        assert index.stats()["record_layout"] == (records or "fixed")
        for start in range(0, len(stored), 80):
            index.add(ids[start : start + 80], stored[start : start + 80])
        assert [sorted(i for i, _ in hits) for hits in index.query(stored)] == expected(np.arange(len(stored)))
        gone = rng.choice(len(stored), 120, replace=False)
        assert index.remove([ids[i] for i in gone]) == 120
        alive = np.setdiff1d(np.arange(len(stored)), gone)
        assert [sorted(i for i, _ in hits) for hits in index.query(stored)] == expected(alive)
    with SegmentIndex(path, None, None, payload_bytes=None, readonly=True) as reader:
        assert [sorted(i for i, _ in hits) for hits in reader.query(stored)] == expected(alive)
    # Removal leaves no fold rows behind: one per keyed segment of each live fold. An index of entries keeps the
    # removed entries' rows until their table is swept (tested below), and lookups skip them.
    if table_values == "entries":
        wanted_rows = int((seg != 0).sum())
    else:
        folds = np.bitwise_xor.reduce(stored, axis=1)
        wanted_rows = len({(t, int(seg[i, t]), int(folds[i])) for i in alive for t in range(segments) if seg[i, t]})
    value_bytes = (entry_key_bytes or 8) if table_values == "entries" else 8
    assert _table_rows(path, segments, key_bytes=2, value_bytes=value_bytes) == wanted_rows


# Swept from the writer's copy of the table in memory, or from LMDB without one.
@pytest.mark.parametrize("mirror_bytes", [256 << 20, 0])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), removals=st.integers(20, 38))
def test_an_index_of_entries_sweeps_removed_rows_out_of_each_table_and_answers_exactly_throughout(
    mirror_bytes: int, seed: int, removals: int
) -> None:
    # Removal leaves an entry-valued table's rows in place; each table drops them at a merge turn once they may
    # be as many as its live rows. Lookups must never return a removed entry, and must find every live one.
    from streamdedup.index.plan import make_segment_plan

    rng = np.random.default_rng(seed)
    bits, segments, size = 256, 8, 32
    fps: dict[str, np.ndarray] = {}
    live: list[str] = []
    queries = _random(20, bits // 64, rng)
    plan = make_segment_plan(bits, segments)
    with (
        tempfile.TemporaryDirectory() as tmp,
        SegmentIndex(tmp, bits, bits, plan=plan, mirror_bytes=mirror_bytes) as index,
    ):
        for batch in range(30):
            # Near copies of live entries (most segments new) and new ids, plus re-added live ids.
            new = _random(40, bits // 64, rng)
            if live:
                sources = np.stack([fps[i] for i in rng.choice(live, 20)])
                kept = rng.random((20, bits // 64)) < 0.25
                new[:20] = np.where(kept, sources, new[:20])
            ids = [f"b{batch}-{i}" for i in range(35)] + (
                list(rng.choice(live, 5, replace=False)) if len(live) >= 5 else []
            )
            new = new[: len(ids)]
            index.add(ids, new)
            fps.update(zip(ids, new, strict=True))
            live = [i for i in live if i not in set(ids)] + ids
            doomed = list(rng.choice(live, min(removals, len(live) - 1), replace=False))
            assert index.remove(doomed) == len(doomed)
            live = [i for i in live if i not in set(doomed)]
            asked = np.concatenate([queries, np.stack([fps[i] for i in rng.choice(list(fps), 30)])])
            alive = np.stack([fps[i] for i in live])
            shares = (_segments(asked, size)[:, None, :] == _segments(alive, size)[None, :, :]).any(axis=2)
            assert [sorted(i for i, _ in hits) for hits in index.query(asked)] == [
                sorted(live[j] for j in np.flatnonzero(row)) for row in shares
            ]
            # Every live entry has its row in every table (merged or staged); the rows of removed entries are
            # no more than the removals each table counts since its last sweep.
            live_seqs, rows = _entry_rows(index, segments)
            with index._read() as txn:
                unswept = index._store.unswept(txn)
            for table in range(segments):
                assert np.isin(live_seqs, rows[table]).all()
                assert len(np.setdiff1d(rows[table], live_seqs)) <= unswept[table]
            assert index.stats()["unswept_removals"] == unswept.max()
        # All but a few removed, each table sweeps at its next turn: then it holds the live entries' rows alone.
        index.remove(live[3:])
        live = live[:3]
        for turn in range(segments):
            index.add([f"last-{turn}"], _random(1, bits // 64, rng))
            live.append(f"last-{turn}")
        live_seqs, rows = _entry_rows(index, segments)
        assert len(live_seqs) == len(live) and all(sorted(r.tolist()) == live_seqs.tolist() for r in rows)
        assert index.stats()["unswept_removals"] == 0
        mirrored = (
            [] if index._cached.mirror is None else [rows for rows in index._cached.mirror.tables if rows is not None]
        )
        assert len(mirrored) == (segments if mirror_bytes else 0)


def _entry_rows(index: SegmentIndex, tables: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The live entries' keys, and per table the entry keys its rows name, merged or staged (white box)."""
    env = index.env
    with env.begin() as txn:
        live = np.frombuffer(b"".join(txn.cursor(env.open_db(b"entries", txn=txn)).iternext(values=False)), ">u8")
    rows = _runs_rows(index)
    assert len(rows) == tables
    return live.astype(np.uint64), [values for _, values in rows]


def _runs_rows(index: SegmentIndex) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per table of an index in the runs layout, its rows' keys and values, merged and still staged (through the
    tables' own reading: a run's chunks, directory and bitmap are not parsed here)."""
    with index.env.begin() as txn:
        staged = index._cached.staged(txn)
        merged = [table.rows(txn) for table in index._store.tables]  # type: ignore[union-attr]
    return [
        (np.concatenate([keys, staged[t].keys.astype(np.uint64)]), np.concatenate([values, staged[t].values]))
        for t, (keys, values) in enumerate(merged)
    ]


def _table_rows(path: Path, tables: int, key_bytes: int, value_bytes: int) -> int:
    """Distinct (table, key, value) rows, merged or still staged."""
    with SegmentIndex(path, None, None, payload_bytes=None, readonly=True) as index:
        if index.fmt.table_layout == "runs":
            return sum(len(set(zip(keys.tolist(), values.tolist(), strict=True))) for keys, values in _runs_rows(index))
    env = lmdb.open(str(path), max_dbs=64, subdir=True, readonly=True)
    try:
        rows = _stored_rows(env, tables, key_bytes, value_bytes)
        return len({(t, key, value) for t, table_rows in enumerate(rows) for key, value in table_rows})
    finally:
        env.close()


def _stored_rows(
    env: lmdb.Environment, tables: int, key_bytes: int, value_bytes: int
) -> list[list[tuple[bytes, bytes]]]:
    """Per table, its (key, value) rows, merged and still staged (white box: a bucket packs its key's values end
    to end, and a staged blob packs rows of the table its key starts with; either may repeat a row)."""
    rows: list[list[tuple[bytes, bytes]]] = [[] for _ in range(tables)]
    with env.begin() as txn:
        for t in range(tables):
            for key, value in txn.cursor(env.open_db(f"table-{t}".encode(), txn=txn)):
                # A dupsort row is one value; a bucket is several, each value_bytes long.
                rows[t].extend((key, value[i : i + value_bytes]) for i in range(0, len(value), value_bytes))
        size = key_bytes + value_bytes
        for blob_key, blob in txn.cursor(env.open_db(b"table-staged", txn=txn)):
            packed = [blob[i : i + size] for i in range(0, len(blob), size)]
            rows[int.from_bytes(blob_key[:2], "big")].extend((row[:key_bytes], row[key_bytes:]) for row in packed)
    return rows


def test_records_of_a_search_come_row_for_row(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    fps = rng.integers(0, 2**64 - 1, size=(50, 2), dtype=np.uint64, endpoint=True)
    with SegmentIndex(tmp_path / "idx", 128, 3, payload_bytes=2) as index:
        origins = [("topic-a", 0, i) if i % 2 else None for i in range(50)]
        index.add(
            [f"e{i}" for i in range(50)],
            fps,
            times=np.arange(50.0),
            payloads=[bytes([i, 7]) for i in range(50)],
            origins=origins,
        )
        queries = fps[[3, 9, 9, 4]].copy()
        queries[:, 0] ^= np.uint64(3)
        result, records = _search_records(index, queries[:3])
        assert result.rows.tolist() == [0, 1, 2]
        assert records.ids == ["e3", "e9", "e9"]
        assert records.origins == [("topic-a", 0, 3), ("topic-a", 0, 9), ("topic-a", 0, 9)]
        assert _search_records(index, queries[3:])[1].origins == [None]
        queries = queries[:3]
        assert records.times.tolist() == [3.0, 9.0, 9.0]
        assert records.payloads.tolist() == [[3, 7], [9, 7], [9, 7]]
        assert [[(i, d)] for i, d in zip(records.ids, result.distances.tolist(), strict=True)] == index.query(queries)
        # Without their payloads, the same records.
        present, bare = index.records_of(result.entries, payloads=False)
        assert present.tolist() == [0, 1, 2] and bare.payloads.shape == (3, 0)
        assert (bare.ids, bare.times.tolist(), bare.origins) == (records.ids, records.times.tolist(), records.origins)
        assert (bare.fingerprints == records.fingerprints).all()


def test_stats_count_the_rows_still_staged(tmp_path: Path) -> None:
    fps = _random(100, 1, np.random.default_rng(4))
    ids = [f"s{i}" for i in range(100)]
    with SegmentIndex(tmp_path, 64, 3, expected_entries=1000) as index:
        tables = len(index.plan.tables)
        index.add(ids, fps)
        # The first table took its turn and merged (an empty table of buckets merges whatever it is given).
        assert index.stats()["staged_rows"] == 100 * (tables - 1)
        index.remove(ids)
        assert index.stats()["staged_rows"] == 0


# --- the writer's copy of the merged tables in memory ----------------------------------------------------


def _near_stream(rng: np.random.Generator, batches: int, size: int, bits: int) -> list[np.ndarray]:
    """Batches of random fingerprints, half of each batch near copies (a quarter of the words kept) of earlier ones."""
    out: list[np.ndarray] = []
    for _ in range(batches):
        new = _random(size, bits // 64, rng)
        if out:
            earlier = np.concatenate(out)
            sources = earlier[rng.integers(0, len(earlier), size // 2)]
            new[: size // 2] = np.where(rng.random((size // 2, bits // 64)) < 0.25, sources, new[: size // 2])
        out.append(new)
    return out


@pytest.mark.parametrize("mirror_bytes", [256 << 20, 8 * 16 * 150])
def test_the_writers_copy_of_the_merged_tables_answers_as_lmdb_does(tmp_path: Path, mirror_bytes: int) -> None:
    # Two writers take the same batches and removals, one reading its merged tables from LMDB alone (sweeps are
    # tested with the copy and without above); with a budget of 150 rows a table the copies are dropped as the
    # tables outgrow it.
    from streamdedup.index.plan import make_segment_plan

    rng = np.random.default_rng(21)
    bits, segments = 256, 8
    plan = make_segment_plan(bits, segments)
    # Five rounds of merge turns: every table has its own round of whole rewrites in them (REWRITE_ROUNDS).
    batches = _near_stream(rng, 40, 40, bits)
    with (
        SegmentIndex(tmp_path / "mirrored", bits, bits, plan=plan, mirror_bytes=mirror_bytes) as mirrored,
        SegmentIndex(tmp_path / "lmdb", bits, bits, plan=plan, mirror_bytes=0) as plain,
    ):
        mirrored_tables = []
        for number, batch in enumerate(batches):
            ids = [f"b{number}-{i}" for i in range(len(batch))]
            for index in (mirrored, plain):
                index.add(ids, batch, times=np.full(len(batch), 1e9 + number))
                if number % 3 == 2:
                    assert index.remove(ids[::4]) == len(ids[::4])
            asked = np.concatenate(batches[: number + 1])
            assert mirrored.query(asked) == plain.query(asked)
            assert mirrored.search(asked).entries.tolist() == plain.search(asked).entries.tolist()
            # Verifying candidates reads their times and payloads through the copy: removed entries are gone.
            from_copy, from_lmdb = mirrored.candidates(asked), plain.candidates(asked)
            for column in ("rows", "entries", "shared"):
                assert getattr(from_copy, column).tolist() == getattr(from_lmdb, column).tolist()
            heads_copy, heads_lmdb = (index.times_and_payloads(from_lmdb.entries) for index in (mirrored, plain))
            for column_copy, column_lmdb in zip(heads_copy, heads_lmdb, strict=True):
                assert column_copy.tolist() == column_lmdb.tolist()
            mirrored_tables.append(sum(rows is not None for rows in mirrored._cached.mirror.tables))
        assert plain._cached.mirror is None
        held = [rows for rows in mirrored._cached.mirror.tables if rows is not None]
        usage = mirrored.usage()
        records = len(mirrored._cached.mirror.records)
        assert records > 0
        # Tables looked up on since their last merge have a directory (4-byte starts) beside their rows.
        directories = [rows._bucket_starts.nbytes for rows in held if rows._bucket_starts is not None]
        assert directories or not held
        assert (usage["mirrored_tables"], usage["mirror_bytes"]) == (
            len(held),
            # Keys of up to 32 bits held in 4 bytes, entry keys in 8.
            12 * sum(map(len, held)) + sum(directories) + (16 + mirrored.fmt.payload_bytes) * records,
        )
        assert (plain.usage()["mirrored_tables"], plain.usage()["mirror_bytes"]) == (0, 0)
    if mirror_bytes > 8 * 16 * 150:
        # The tables are copied while empty, at the first batch, and kept through their merges.
        assert set(mirrored_tables) == {8}
    else:
        assert max(mirrored_tables) >= 1 and mirrored_tables[-1] == 0


def test_entries_a_batch_adds_and_evicts_at_once_read_as_gone_through_the_writers_copy(tmp_path: Path) -> None:
    # The writer holds the times and sketches of the entries it stores; those its own batch evicts at once
    # (index.max_entries) must not come back as candidates from that copy.
    from streamdedup.index.plan import make_segment_plan

    rng = np.random.default_rng(23)
    bits = 256
    batches = _near_stream(rng, 6, 30, bits)
    payloads = [rng.integers(0, 256, (len(batch), 8), dtype=np.uint8) for batch in batches]
    opened = [
        SegmentIndex(
            tmp_path / name,
            bits,
            bits,
            plan=make_segment_plan(bits, 8),
            payload_bytes=8,
            max_entries=20,
            mirror_bytes=mirror_bytes,
        )
        for name, mirror_bytes in (("mirrored", 256 << 20), ("lmdb", 0))
    ]
    with opened[0] as mirrored, opened[1] as plain:
        for number, (batch, payload) in enumerate(zip(batches, payloads, strict=True)):
            for index in (mirrored, plain):
                index.add(
                    [f"b{number}-{i}" for i in range(len(batch))],
                    batch,
                    payloads=payload,
                    times=np.full(len(batch), 1e9 + number),
                )
            asked = np.concatenate(batches[: number + 1])
            from_copy, from_lmdb = mirrored.candidates(asked), plain.candidates(asked)
            assert len(from_copy) > 0
            assert set(from_copy.entries.tolist()) <= set(range((number + 1) * 30))
            for column in ("rows", "entries", "shared"):
                assert getattr(from_copy, column).tolist() == getattr(from_lmdb, column).tolist()
            heads_copy, heads_lmdb = (index.times_and_payloads(from_lmdb.entries) for index in (mirrored, plain))
            for column_copy, column_lmdb in zip(heads_copy, heads_lmdb, strict=True):
                assert column_copy.tolist() == column_lmdb.tolist()
            # The copy never holds an entry the batch evicted: those read as no longer stored.
            stored, _, _ = heads_copy
            live = from_lmdb.entries >= max(0, (number + 1) * 30 - 20)
            assert stored.tolist() == live.tolist()
        assert len(mirrored) == len(plain) == 20


_ADD_BATCHES = """
import sys
import numpy as np
from streamdedup.index import SegmentIndex
batches = np.load(sys.argv[2])
with SegmentIndex(sys.argv[1], None, None, payload_bytes=None) as index:
    for number, batch in enumerate(batches):
        index.add([f"other-{number}-{i}" for i in range(len(batch))], batch)
"""


def test_the_writers_copy_is_not_used_after_another_process_writes_or_a_batch_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamdedup.index.plan import make_segment_plan

    rng = np.random.default_rng(22)
    bits, segments = 256, 8
    with SegmentIndex(tmp_path, bits, bits, plan=make_segment_plan(bits, segments)) as index:
        for number in range(segments):
            index.add([f"own-{number}-{i}" for i in range(20)], _random(20, bits // 64, rng))
        assert all(rows is not None for rows in index._cached.mirror.tables)
        # Another process adds a batch per table: every table merges the first one's rows, which the copy lacks.
        others = np.stack([_random(10, bits // 64, rng) for _ in range(segments)])
        np.save(tmp_path.parent / "others.npy", others)
        subprocess.run(
            [sys.executable, "-c", _ADD_BATCHES, str(tmp_path), str(tmp_path.parent / "others.npy")],
            check=True,
            cwd=ROOT,
            timeout=120,
        )
        assert index.query(others[0]) == [[(f"other-0-{i}", 0)] for i in range(10)]

        # A batch that fails after its merge: the entry keys it took are given to the next batch, so rows of it
        # left in the copy would name that batch's documents.
        failed, next_batch = _random(10, bits // 64, rng), _random(10, bits // 64, rng)

        def unstage_fails(*_: object) -> None:
            raise RuntimeError("the batch fails after its rows were merged")

        # Both batches merge at their turn, whatever the round (REWRITE_ROUNDS): the first one's merge fails.
        monkeypatch.setattr(index._writes, "_may_rewrite", lambda *_: True)
        with pytest.MonkeyPatch.context() as failing:
            failing.setattr(index._writes.staging, "unstage", unstage_fails)
            with pytest.raises(RuntimeError, match="after its rows were merged"):
                index.add([f"failed-{i}" for i in range(10)], failed)
        index.add([f"next-{i}" for i in range(10)], next_batch)
        assert index.query(failed) == [[]] * 10
        assert index.query(next_batch) == [[(f"next-{i}", 0)] for i in range(10)]
        assert sum(rows is not None for rows in index._cached.mirror.tables) >= 1


def _hot_stream(rng: np.random.Generator, n: int, segments: int, size: int) -> np.ndarray:
    """Segmented fingerprints as templates make them: each segment takes one of a few hot values, a rarer
    value, or zero (unkeyed), so some keys are shared by most entries and others by a few."""
    hot = rng.integers(1, 1 << size, size=(segments, 3), dtype=np.uint64)
    draw = rng.random((n, segments))
    seg = np.where(draw < 0.6, hot[np.arange(segments), rng.integers(0, 3, (n, segments))], 0)
    rare = rng.integers(1, 1 << size, size=(n, segments), dtype=np.uint64)
    seg = np.where((draw >= 0.6) & (draw < 0.9), rare % np.uint64(50) + np.uint64(1), seg).astype(np.uint64)
    per_word = 64 // size
    shifts = np.arange(per_word - 1, -1, -1, dtype=np.uint64) * np.uint64(size)
    return np.bitwise_or.reduce(seg.reshape(n, segments // per_word, per_word) << shifts, axis=2)


@pytest.mark.parametrize("mirror_bytes", [256 << 20, 0])
@pytest.mark.parametrize(("bits", "segments"), [(256, 8), (1024, 32)])
@pytest.mark.parametrize("counted_by", ["the write", "the lookup before it", "a lookup before the last write"])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), capacity=st.integers(1, 6), limit=st.integers(1, 12))
def test_a_key_leads_to_its_first_entries_up_to_its_capacity_and_a_lookup_verifies_the_most_shared(
    mirror_bytes: int, bits: int, segments: int, counted_by: str, seed: int, capacity: int, limit: int
) -> None:
    # Brute force over the stream: an entry is posted under a key while fewer than `capacity` earlier entries
    # are; a query's candidates are the posted entries sharing a key with it, those sharing the most tables
    # first, the newest among equals, at most `limit`; for a query keyed in LONE_SEGMENT_LIMIT tables or more,
    # only those sharing two tables or more; for a query keyed in RARE_SEGMENT_LIMIT tables or more whose keys
    # are not full (posted fewer than `capacity` times), its full keys count for nothing. A batch's keys may come
    # with the rows each holds, as a lookup counted them just before (a decision's way) or before another batch
    # was stored (then counted again).
    from streamdedup.index.keys import LONE_SEGMENT_LIMIT, RARE_SEGMENT_LIMIT, table_keys
    from streamdedup.index.plan import make_segment_plan

    rng = np.random.default_rng(seed)
    size = 32
    plan = make_segment_plan(bits, segments)
    batches = [_hot_stream(rng, int(rng.integers(1, 60)), segments, size) for _ in range(12)]
    stored = np.concatenate(batches)
    seg = _segments(stored, size)
    posted = np.zeros(seg.shape, dtype=bool)
    for table in range(segments):
        for key in np.unique(seg[:, table]):
            if key:
                posted[np.flatnonzero(seg[:, table] == key)[:capacity], table] = True
    with tempfile.TemporaryDirectory() as tmp:
        index = SegmentIndex(tmp, bits, bits, plan=plan, mirror_bytes=mirror_bytes, key_capacity=capacity)
        with index:
            start = 0
            counted_early: HeldRows | None = None
            for k, batch in enumerate(batches):
                keys = table_keys(plan, batch)
                if counted_by == "the lookup before it":
                    keys = keys.with_held(_held(index, keys, batch))
                elif counted_by == "a lookup before the last write":
                    keys = keys.with_held(counted_early or _held(index, keys, batch))
                    if k + 1 < len(batches):
                        counted_early = _held(index, table_keys(plan, batches[k + 1]), batches[k + 1])
                index.add([f"e{i}" for i in range(start, start + len(batch))], batch, keys=keys)
                start += len(batch)
            # Every table holds exactly the posted rows.
            _, rows = _entry_rows(index, segments)
            for table in range(segments):
                assert sorted(rows[table].tolist()) == np.flatnonzero(posted[:, table]).tolist()
            queries = np.concatenate([stored[rng.integers(0, len(stored), 30)], _hot_stream(rng, 30, segments, size)])
            found = index.search(queries, max_candidates=limit)
        qs = _segments(queries, size)
        both = (qs[:, None, :] == seg[None, :, :]) & (qs[:, None, :] != 0) & posted[None, :, :]
        keyed = (qs != 0).sum(axis=1)
        full = both.sum(axis=1) >= capacity
        rare = ((qs != 0) & ~full).sum(axis=1)
        followed = np.where((rare >= RARE_SEGMENT_LIMIT)[:, None], ~full, True)
        shared = (both & followed[:, None, :]).sum(axis=2)
        for row in range(len(queries)):
            sharing = np.flatnonzero(shared[row])
            expected = sorted(sharing.tolist(), key=lambda entry: (-shared[row, entry], -entry))[:limit]
            if keyed[row] >= LONE_SEGMENT_LIMIT:
                expected = [entry for entry in expected if shared[row, entry] >= 2]
            assert sorted(found.entries[found.rows == row].tolist()) == sorted(expected)
        assert np.bincount(found.rows, minlength=len(queries)).max() <= limit


def _held(index: SegmentIndex, keys: TableKeys, fps: np.ndarray) -> HeldRows:
    held = index.candidates(fps, keys=keys).held
    assert held is not None
    return held


# ------------------------------------------------------------------ a rollback leaves no trace


class _Oracle:
    """What the index holds and answers, kept the brute-force way: expiry by whole time buckets before the
    clock's cutoff, then the entries with ``max_entries`` or more kept documents stored after them."""

    def __init__(self, radius: int, max_age: float, max_entries: int, bucket: float) -> None:
        self.radius, self.max_age, self.max_entries, self.bucket = radius, max_age, max_entries, bucket
        self.entries: list[tuple[int, str, int, float]] = []  # (seq, id, fingerprint, time)
        self.window: list[float] = []
        self.clock = -math.inf
        self.next_seq = 0

    def batch(self, ids: list[str], fps: list[int], times: list[float]) -> list[bool]:
        kept: list[int] = []
        for row, fp in enumerate(fps):
            stored = any((fp ^ f).bit_count() <= self.radius for _, i, f, _ in self.entries if i != ids[row])
            earlier = any((fp ^ fps[k]).bit_count() <= self.radius for k in kept)
            if not stored and not earlier:
                kept.append(row)
        if kept:
            new = {ids[k] for k in kept}
            self.entries = [e for e in self.entries if e[1] not in new]
            for k in kept:
                self.entries.append((self.next_seq, ids[k], fps[k], times[k]))
                self.next_seq += 1
            self.window = (self.window + [times[k] for k in kept])[-CLOCK_WINDOW:]
            self.clock = max(float(np.median(self.window)), self.clock)
            cutoff = math.floor((self.clock - self.max_age) / self.bucket)
            self.entries = [e for e in self.entries if math.floor(e[3] / self.bucket) >= cutoff]
            self.entries = [e for e in self.entries if e[0] >= self.next_seq - self.max_entries]
        return [row in kept for row in range(len(ids))]


def _replay_stream(seed: int, n: int) -> tuple[list[str], np.ndarray, np.ndarray, list[int]]:
    """Ids, 64-bit fingerprints (a third near copies of earlier ones), event times (rising, some late) and batch
    sizes."""
    rng = np.random.default_rng(seed)
    fps = _random(n, 1, rng)
    copies = np.flatnonzero(rng.random(n) < 0.35)
    copies = copies[copies > 0]
    sources = (rng.random(len(copies)) * copies).astype(np.int64)
    fps[copies] = _flip(fps[sources], rng.integers(0, 6, len(copies)), rng)
    times = np.arange(n, dtype=np.float64) + rng.normal(0, 3, n).round(1)
    sizes = []
    while sum(sizes) < n:
        sizes.append(int(min(rng.integers(1, 13), n - sum(sizes))))
    return [f"d{i}" for i in range(n)], fps, times, sizes


@pytest.mark.parametrize("bits", [64, 256])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_rolled_back_batch_leaves_no_trace_in_expiry_eviction_or_the_clock(
    tmp_path: Path, bits: int, seed: int
) -> None:
    n, max_age, max_entries, bucket = 900, 120.0, 60, 10.0
    ids, fps64, times, sizes = _replay_stream(seed, n)
    rng = random.Random(seed)
    # 256 bits: an index of entries (its tables name entries, kept or swept), compared with the run without
    # rollbacks; 64 bits: an index of folds, compared with the brute-force oracle as well.
    fps = fps64 if bits == 64 else np.repeat(fps64, bits // 64, axis=1)
    plan = None if bits == 64 else make_segment_plan(bits, bits // 32)
    radius = 3 if bits == 64 else bits

    def open_index(path: Path) -> SegmentIndex:
        return SegmentIndex(
            path, bits, radius, plan=plan, max_age=max_age, max_entries=max_entries, time_bucket=bucket, sync=False
        )

    bounds = np.cumsum([0, *sizes]).tolist()

    def decide(index: SegmentIndex, b: int) -> list[bool]:
        """Keep each document that matches no stored entry (but its own id) and no earlier kept one of its batch."""
        low, high = bounds[b], bounds[b + 1]
        batch = fps[low:high]
        found, records = _search_records(index, batch)
        pairs = zip(found.rows.tolist(), records.ids, strict=True)
        matched = {row for row, entry_id in pairs if entry_id != ids[low + row]}
        earlier, later, _ = table_keys(index.plan, batch).pairs(batch)
        kept: list[int] = []
        for row in range(high - low):
            if row not in matched and not set(earlier[later == row].tolist()) & set(kept):
                kept.append(row)
        index.add(
            [ids[low + k] for k in kept],
            batch[kept],
            times=times[low:high][kept],
            origins=[("in", 0, low + k) for k in kept],
            source_offsets={("in", 0): high},
        )
        return [row in kept for row in range(high - low)]

    def contents(index: SegmentIndex) -> tuple[list[tuple[str, str, float]], float | None]:
        return [(e["id"], e["fingerprint"], e["time"]) for e in index.export()], index.stats()["clock"]

    with open_index(tmp_path / "straight") as straight, open_index(tmp_path / "replayed") as replayed:
        expected: list[bool] = []
        oracle = _Oracle(3, max_age, max_entries, bucket)
        for b in range(len(sizes)):
            verdicts = decide(straight, b)
            expected += verdicts
            if bits == 64:
                low, high = bounds[b], bounds[b + 1]
                assert verdicts == oracle.batch(ids[low:high], fps64[low:high, 0].tolist(), times[low:high].tolist()), b
        if bits == 64:
            assert [e[0] for e in contents(straight)[0]] == [e[1] for e in oracle.entries]
            assert contents(straight)[1] == oracle.clock
        evicted = n - len(straight)
        assert len(straight) <= max_entries and evicted > n // 2

        got: list[bool] = []
        rollbacks = b = 0
        while b < len(sizes):
            got[bounds[b] :] = decide(replayed, b)
            b += 1
            if b >= 2 and rng.random() < 0.3:
                back = rng.choice([1, 2])
                b -= back
                removed = replayed.rollback({("in", 0): bounds[b]})
                assert removed == sum(got[bounds[b] : bounds[b + back]])
                rollbacks += 1
        assert rollbacks > 20
        assert got == expected
        assert contents(replayed) == contents(straight)
        assert len(replayed) == len(straight)


def test_a_rollback_past_what_it_can_undo_removes_the_entries_alone(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    fps = _random(40, 1, rng)
    with SegmentIndex(tmp_path / "i", 64, 3, max_entries=10, time_bucket=1.0, sync=False) as index:
        for b in range(4):
            rows = range(10 * b, 10 * b + 10)
            index.add(
                [f"d{i}" for i in rows],
                fps[list(rows)],
                times=[float(i) for i in rows],
                origins=[("in", 0, i) for i in rows],
                source_offsets={("in", 0): 10 * b + 10},
            )
        assert index.stats()["undoable_batches"] == 4
        # The batch at offsets 30.. is undone whole: the ten it evicted (offsets 20..) come back.
        assert index.rollback({("in", 0): 30}) == 10
        assert [e["id"] for e in index.export()] == [f"d{i}" for i in range(20, 30)]
        assert index.stats()["clock"] == 14.5
        # Offsets 25.. end in the middle of a batch: those five are removed alone, and nothing older is undone.
        assert index.rollback({("in", 0): 25}) == 5
        assert [e["id"] for e in index.export()] == [f"d{i}" for i in range(20, 25)]
        assert index.stats()["undoable_batches"] == 0
        # Never kept after all, the five count for no earlier entry: d20 has four kept documents after it.
        d20 = _search_records(index, fps[20:21])[0].entries[:1]
        assert index.kept_after(d20).tolist() == [4]


def test_entry_keys_fit_the_tables_or_the_batch_is_refused(tmp_path: Path) -> None:
    from streamdedup.index.store import META_NEXT_SEQ

    fps = _random(4, 16, np.random.default_rng(14))
    with SegmentIndex(tmp_path, 1024, 1024, plan=make_segment_plan(1024, 32)) as index:
        index.add(["a"], fps[:1])
        last = (1 << (8 * ENTRY_KEY_BYTES)) - 1
        with index.env.begin(write=True) as txn:
            index._store.put_counter(txn, META_NEXT_SEQ, last)
        with pytest.raises(IndexStorageError, match="entry keys"):
            index.add(["b", "c"], fps[1:3])
        assert len(index) == 1
        index.add(["d"], fps[3:4])  # the last entry key a table row can name
        assert [hits[0][0] for hits in index.query(fps[[0, 3]])] == ["a", "d"]
        assert index.query(fps[1:3]) == [[], []]
