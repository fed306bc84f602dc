"""The write path: a batch stored in consecutive parts (the service's queued batches, decided together)."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np

from streamdedup.index import SegmentIndex
from streamdedup.index.plan import make_segment_plan
from streamdedup.index.store import META_NEXT_MERGE

BITS, SEGMENTS, CAPACITY = 256, 8, 4
PARTS = (0, 100, 200, 300)
ORIGINS = [("in", 0, offset) for offset in range(300)]


def _index(path: Path) -> SegmentIndex:
    return SegmentIndex(
        path,
        BITS,
        BITS,
        plan=make_segment_plan(BITS, SEGMENTS),
        expected_entries=1000,
        key_capacity=CAPACITY,
        time_bucket=10.0,
    )


def _stream() -> tuple[list[str], np.ndarray, np.ndarray]:
    """300 documents: 12 share their first segment (a key past capacity) across the parts, and the second
    part re-adds an id of the first with another fingerprint."""
    rng = np.random.default_rng(7)
    fps = rng.integers(0, 2**64 - 1, size=(300, BITS // 64), dtype=np.uint64, endpoint=True)
    hot = np.arange(0, 300, 25)
    fps[hot, 0] = (fps[hot, 0] & np.uint64(0xFFFFFFFF)) | np.uint64(0xABCD1234 << 32)
    ids = [f"d{i}" for i in range(300)]
    ids[150] = ids[10]
    return ids, fps, np.arange(300, dtype=np.float64) + 1_700_000_000.0


def _offsets(end: int) -> dict[tuple[str, int], int]:
    return {("in", 0): end}


def _merge_turns(index: SegmentIndex) -> int:
    with index.env.begin() as txn:
        return index._store.counter(txn, META_NEXT_MERGE)


def _live_rows(index: SegmentIndex) -> list[set[tuple[int, int]]]:
    """Per table, the (key, entry key) rows of stored entries, merged or staged (white box)."""
    with index.env.begin() as txn:
        live = np.frombuffer(
            b"".join(txn.cursor(index.env.open_db(b"entries", txn=txn)).iternext(values=False)), ">u8"
        ).tolist()
        staged = index._cached.staged(txn)
        merged = [table.rows(txn) for table in index._store.tables]  # type: ignore[union-attr]
    alive = set(live)
    return [
        {
            (key, value)
            for key, value in zip(
                np.concatenate([keys, staged[t].keys.astype(np.uint64)]).tolist(),
                np.concatenate([values, staged[t].values]).tolist(),
                strict=True,
            )
            if value in alive
        }
        for t, (keys, values) in enumerate(merged)
    ]


def _one_by_one(path: Path, parts: int) -> SegmentIndex:
    ids, fps, times = _stream()
    index = _index(path)
    for low, high in pairwise(PARTS[: parts + 1]):
        index.add(
            ids[low:high],
            fps[low:high],
            times=times[low:high],
            origins=ORIGINS[low:high],
            source_offsets=_offsets(high),
        )
    return index


def test_a_batch_in_parts_stores_what_its_parts_store_one_by_one_with_one_turn_of_table_work(tmp_path: Path) -> None:
    ids, fps, times = _stream()
    with _index(tmp_path / "parts") as joined, _one_by_one(tmp_path / "apart", 3) as apart:
        joined.add(ids, fps, times=times, origins=ORIGINS, parts=[(end, _offsets(end)) for end in PARTS[1:]])
        assert [entry["id"] for entry in joined.export()] == [entry["id"] for entry in apart.export()]
        assert len(joined) == len(apart) == 299
        # The re-added id is the second part's document.
        replaced = [entry for entry in joined.export() if entry["id"] == "d10"]
        assert [entry["fingerprint"] for entry in replaced] == ["".join(f"{int(w):016x}" for w in fps[150])]
        assert joined.source_offsets() == apart.source_offsets() == {("in", 0): 300}
        assert joined.stats()["undoable_batches"] == apart.stats()["undoable_batches"] == 3
        assert _live_rows(joined) == _live_rows(apart)
        # The hot key keeps its first documents, counted across the parts as across batches.
        hot_rows = [row for row in _live_rows(joined)[0] if row[0] == 0xABCD1234]
        assert len(hot_rows) == CAPACITY
        # The tables took the whole batch in one turn; stored apart, each part took one.
        assert (_merge_turns(joined), _merge_turns(apart)) == (1, 3)


def test_a_rollback_between_parts_leaves_the_index_of_the_earlier_parts(tmp_path: Path) -> None:
    ids, fps, times = _stream()
    with _index(tmp_path / "parts") as joined, _one_by_one(tmp_path / "apart", 2) as apart:
        joined.add(ids, fps, times=times, origins=ORIGINS, parts=[(end, _offsets(end)) for end in PARTS[1:]])
        assert joined.rollback(_offsets(200)) == 100
        assert [entry["id"] for entry in joined.export()] == [entry["id"] for entry in apart.export()]
        assert joined.stats()["clock"] == apart.stats()["clock"]
        assert joined.source_offsets() == apart.source_offsets() == {("in", 0): 200}
        assert joined.query(fps) == apart.query(fps)
        found = joined.query(fps)
        # Every stored document finds itself (d10 as its second fingerprint); the rolled-back ones find nothing
        # but the hot key's first documents.
        assert all(found[i] for i in range(200) if i != 10)
        assert not any(found[i] for i in range(200, 300) if i % 25)
