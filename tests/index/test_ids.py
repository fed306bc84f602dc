from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamdedup.index import SegmentIndex
from streamdedup.index.ids import HashedIds, IdKeys
from streamdedup.index.store import META_UNSWEPT_IDS, id_hashes, keys_of_ids
from tests.index.test_segment import _index_as_written_by, _random


def _stored(index: SegmentIndex) -> dict[str, str]:
    """Every stored entry's id and fingerprint, read from the entries themselves (not through the ids)."""
    return {entry["id"]: entry["fingerprint"] for entry in index.export()}


def _found(index: SegmentIndex, asked: list[str]) -> dict[str, str]:
    at, records = index.entries_with_ids(asked)
    assert records.ids == [asked[i] for i in at.tolist()]
    return {asked[i]: "".join(f"{int(w):016x}" for w in records.fingerprints[row]) for row, i in enumerate(at.tolist())}


def _open(tmp_path: Path, layout: str, **options: Any) -> SegmentIndex:
    """A new index, as this code writes one (ids in runs) or as formats 1-7 did (ids as keys)."""
    path = tmp_path / layout
    if layout == "keys":
        with SegmentIndex(tmp_path / "reference", 64, 3, expected_entries=1000):
            pass
        _index_as_written_by(path, tmp_path / "reference", version=7, ids=None)
    index = SegmentIndex(path, 64, 3, expected_entries=1000, **options)
    assert index.stats()["id_layout"] == layout
    assert isinstance(index._lookup.ids, HashedIds if layout == "runs" else IdKeys)
    return index


@pytest.mark.parametrize("layout", ["runs", "keys"])
def test_ids_lead_to_their_stored_entries_through_re_adds_removals_and_rollbacks(tmp_path: Path, layout: str) -> None:
    rng = np.random.default_rng(21)
    used: list[str] = []
    offset = 0
    with _open(tmp_path, layout) as index:
        for batch in range(12):
            # New ids, ids stored before (re-added: the new entry replaces the old), and one id twice.
            new = [f"doc-{batch}-{i}-" + "x" * int(rng.integers(0, 40)) for i in range(40)]
            again = list(rng.choice(used, size=min(len(used), 10), replace=False)) if used else []
            ids = [*new, *again, new[0]]
            used.extend(new)
            origins = [("in", 0, offset + i) for i in range(len(ids))]
            offset += len(ids)
            index.add(ids, _random(len(ids), 1, rng), origins=origins, source_offsets={("in", 0): offset})
            if batch % 3 == 2:
                index.remove(list(rng.choice(used, size=25, replace=False)))
            if batch % 4 == 3:
                # The newest batch undone: its entries go, and those it replaced come back.
                offset -= len(ids)
                index.rollback({("in", 0): offset})
            asked = [*used, "never-stored", used[0]]
            assert _found(index, asked) == _stored(index)
        assert len(_stored(index)) == len(index) > 0


def test_a_hash_shared_by_two_ids_finds_each_its_own_entry(tmp_path: Path) -> None:
    with _open(tmp_path, "runs") as index:
        index.add(["alpha", "beta"], np.array([[1], [2]], dtype=np.uint64))
        ids = index._lookup.ids
        assert isinstance(ids, HashedIds)
        # A row naming beta's entry under alpha's hash, as a collision of the two would store it.
        alpha_hash = id_hashes(keys_of_ids([b"alpha"]), hashed_bytes=480)
        with index.env.begin() as txn:
            beta_entry = ids.find(txn, [b"beta"])[1]
        index._write(lambda txn: ids.runs.insert(txn, alpha_hash, beta_entry))
        assert _found(index, ["alpha", "beta", "gamma"]) == {"alpha": f"{1:016x}", "beta": f"{2:016x}"}
        index.remove(["alpha"])
        assert _found(index, ["alpha", "beta"]) == {"beta": f"{2:016x}"}


def test_rows_of_removed_entries_are_swept_once_as_many_as_the_entries(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    with _open(tmp_path, "runs") as index:
        ids = index._lookup.ids
        assert isinstance(ids, HashedIds)

        def rows_and_unswept() -> tuple[int, int]:
            with index.env.begin() as txn:
                return ids.runs.row_count(txn), index._store.counter(txn, META_UNSWEPT_IDS)

        names = [f"s{i}" for i in range(100)]
        index.add(names, _random(100, 1, rng))
        assert index.remove(names[:50]) == 50
        # Removed entries keep their rows until they are as many as the entries.
        index.add(["t0"], _random(1, 1, rng))
        assert rows_and_unswept() == (101, 50)
        assert index.remove(names[50:52]) == 2
        index.add(["t1"], _random(1, 1, rng))
        assert rows_and_unswept() == (50, 0)
        assert set(_found(index, [*names, "t0", "t1"])) == {*names[52:], "t0", "t1"}


def test_a_sweep_keeps_the_rows_of_entries_a_rollback_restores(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    first = [f"f{i}" for i in range(30)]
    with _open(tmp_path, "runs") as index:
        index.add(first, _random(30, 1, rng), origins=[("in", 0, i) for i in range(30)])
        before = _stored(index)
        # One batch re-adds every id (their entries removed, a rollback may restore them) and sweeps.
        index.add(first, _random(30, 1, rng), origins=[("in", 0, 30 + i) for i in range(30)])
        with index.env.begin() as txn:
            assert index._store.counter(txn, META_UNSWEPT_IDS) == 0
        assert _found(index, first) == _stored(index) != before
        assert index.rollback({("in", 0): 30}) == 30
        assert _found(index, first) == _stored(index) == before
