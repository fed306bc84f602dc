"""Ids cut from one buffer: read one by one, in slices, reordered, and compared as the strings they hold."""

from __future__ import annotations

import numpy as np

from streamdedup.index.packed_ids import PackedIds


def test_ids_decode_where_read_and_reorder_without_decoding() -> None:
    records = [b"HEADid-\xc3\xa9", b"HEADb", b"HEAD\xe2\x82\xac3"]
    buffer = b"".join(records)
    stops = np.cumsum([len(r) for r in records])
    ids = PackedIds(buffer, stops - np.array([len(r) for r in records]) + 4, stops)
    assert len(ids) == 3 and ids[0] == "id-é" and ids[2] == "€3"
    assert list(ids) == ["id-é", "b", "€3"] and ids[1:] == ["b", "€3"]
    assert ids.take(np.array([2, 0, 0])) == ["€3", "id-é", "id-é"]
    assert ids == ("id-é", "b", "€3") and ids != ["b"] and ids != "id-ébc3"


def test_ids_of_several_buffers_join_into_one() -> None:
    first = PackedIds(b"xxab", np.array([2, 3]), np.array([3, 4]))
    second = PackedIds(b"cde", np.array([0, 1]), np.array([1, 3])).take(np.array([1, 0]))
    joined = PackedIds.joined([first, second])
    assert joined == ["a", "b", "de", "c"]
    assert joined.take(np.array([3, 0])) == ["c", "a"]
    assert PackedIds.joined([first]) is first and len(PackedIds.joined([])) == 0
