from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamdedup.index import SegmentIndex
from streamdedup.index.contents import Contents, content_hashes
from streamdedup.index.plan import make_segment_plan
from streamdedup.index.store import META_UNSWEPT_CONTENTS
from tests.index.test_segment import _index_as_written_by, _random

BITS, SEGMENTS, PAYLOAD = 256, 16, 12


@pytest.mark.parametrize("width", [PAYLOAD, 16])
def test_content_hashes_tell_rows_apart_whatever_the_batch(width: int) -> None:
    rng = np.random.default_rng(width)
    fps, payloads = _random(500, 4, rng), rng.integers(0, 256, size=(500, width), dtype=np.uint8)
    hashes = content_hashes(fps, payloads)
    assert len(np.unique(hashes)) == 500
    # A row hashes alike in any batch, and a payload that is a strided view hashes as its copy.
    assert content_hashes(fps[7:9], payloads[7:9]).tolist() == hashes[7:9].tolist()
    wide = np.zeros((500, width + 4), dtype=np.uint8)
    wide[:, :width] = payloads
    assert content_hashes(fps, wide[:, :width]).tolist() == hashes.tolist()
    # One bit of the fingerprint or of the payload changes the hash.
    flipped_fp, flipped_payload = fps.copy(), payloads.copy()
    flipped_fp[:, 3] ^= np.uint64(1 << 40)
    flipped_payload[:, width - 1] ^= 1
    assert not np.isin(content_hashes(flipped_fp, payloads), hashes).any()
    assert not np.isin(content_hashes(fps, flipped_payload), hashes).any()


def _open(path: Path, **options: Any) -> SegmentIndex:
    """A segmented index whose keys take one row each: a second entry of the same fingerprint has no room."""
    plan = make_segment_plan(BITS, SEGMENTS)
    return SegmentIndex(path, BITS, BITS, plan=plan, payload_bytes=PAYLOAD, key_capacity=1, **options)


def _rows(index: SegmentIndex) -> tuple[int, int]:
    contents = index._lookup.contents
    assert isinstance(contents, Contents)
    with index.env.begin() as txn:
        return contents.row_count(txn), index._store.counter(txn, META_UNSWEPT_CONTENTS)


def test_every_entry_is_found_by_its_content_whatever_its_keys(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    fps = _random(3, BITS // 64, rng)
    payloads = rng.integers(0, 256, size=(4, PAYLOAD), dtype=np.uint8)
    with _open(tmp_path / "idx") as index:
        index.add(["a", "b", "c"], fps, payloads=payloads[:3])
        # Each fingerprint's second entry finds every key full: the tables hold none of its rows.
        index.add(["a2", "b2", "c2"], fps, payloads=payloads[[3, 0, 1]])
        assert _rows(index) == (6, 0)
        rows, entries = index.same_contents(fps[[0, 1, 2, 0]], payloads[[3, 0, 1, 0]])
        _, records = index.records_of(entries)
        assert rows.tolist() == [0, 1, 2, 3] and records.ids == ["a2", "b2", "c2", "a"]
        # Through the tables, each fingerprint leads to its first entry alone.
        found = index.candidates(fps)
        _, first = index.records_of(found.entries)
        assert found.rows.tolist() == [0, 1, 2] and first.ids == ["a", "b", "c"]
        # A removed entry's row stays until as many entries were removed as are stored, then goes in a sweep.
        assert index.remove(["a2"]) == 1
        index.add(["d"], _random(1, BITS // 64, rng), payloads=payloads[:1])
        assert _rows(index) == (7, 1)
        # a, c, d and e stay stored: the fourth removal is due its sweep.
        assert index.remove(["b2", "c2", "b"]) == 3
        index.add(["e"], _random(1, BITS // 64, rng), payloads=payloads[:1])
        assert _rows(index) == (4, 0)
        assert len(index.same_contents(fps, payloads[[3, 0, 1]])[0]) == 0


def test_a_rollback_restores_what_a_re_add_removed_and_the_sweep_kept(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    fps = _random(1, BITS // 64, rng)
    payloads = rng.integers(0, 256, size=(2, PAYLOAD), dtype=np.uint8)
    with _open(tmp_path / "idx") as index:
        index.add(["a"], fps, payloads=payloads[:1], origins=[("in", 0, 0)])
        index.add(["b"], fps, payloads=payloads[1:], origins=[("in", 0, 1)])
        # Re-adding both removes their entries (a rollback may restore them) and sweeps: their rows stay.
        index.add(["a", "b"], _random(2, BITS // 64, rng), payloads=payloads, origins=[("in", 0, 2), ("in", 0, 3)])
        assert _rows(index) == (4, 0)
        assert index.rollback({("in", 0): 2}) == 2
        # The restored entries' rows are live again; the undone ones' stay until a sweep (their records are gone,
        # so they confirm nothing): the sweep that kept the restored rows counted the removals the rollback undid.
        assert _rows(index) == (4, 0)
        rows, entries = index.same_contents(np.repeat(fps, 2, axis=0), payloads)
        _, records = index.records_of(entries)
        assert records.ids == ["a", "b"] and rows.tolist() == [0, 1]


def test_every_entry_has_a_row_however_few_keys_it_is_stored_under(tmp_path: Path) -> None:
    rng = np.random.default_rng(10)
    plan = make_segment_plan(BITS, SEGMENTS)
    # Fingerprints with most segments zero (unkeyed: too few features), as short texts have, and whole ones.
    fps = _random(40, BITS // 64, rng)
    keyed = rng.integers(1, 5, size=40)
    mask = np.zeros((40, SEGMENTS), dtype=bool)
    for row, count in enumerate(keyed.tolist()):
        mask[row, rng.choice(SEGMENTS, size=count, replace=False)] = True
    mask[::2] = True
    bits = BITS // SEGMENTS
    segment_mask = np.uint64((1 << bits) - 1)
    for segment in range(SEGMENTS):
        word, shift = divmod(segment * bits, 64)
        fps[~mask[:, segment], word] &= ~(segment_mask << np.uint64(shift))
    payloads = rng.integers(0, 256, size=(40, PAYLOAD), dtype=np.uint8)
    with SegmentIndex(tmp_path / "idx", BITS, BITS, plan=plan, payload_bytes=PAYLOAD) as index:
        index.add([f"e{i}" for i in range(40)], fps, payloads=payloads)
        rows, entries = index.same_contents(fps, payloads)
        # Another payload is another content.
        assert len(index.same_contents(fps, payloads[::-1])[0]) == 0
    assert rows.tolist() == list(range(40))
    assert entries.tolist() == rows.tolist()


def test_an_index_from_before_contents_has_none_and_still_decides(tmp_path: Path) -> None:
    with _open(tmp_path / "reference"):
        pass
    _index_as_written_by(tmp_path / "old", tmp_path / "reference", version=8, contents=None)
    rng = np.random.default_rng(11)
    fps = _random(2, BITS // 64, rng)
    payloads = rng.integers(0, 256, size=(2, PAYLOAD), dtype=np.uint8)
    with _open(tmp_path / "old") as index:
        assert index.stats()["contents"] is False
        index.add(["a", "b"], fps, payloads=payloads)
        assert index.same_contents(fps, payloads) is None
        assert len(index.candidates(fps)) == 2
    with _open(tmp_path / "new") as index:
        assert index.stats()["contents"] is True
