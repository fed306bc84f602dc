"""Verdict records: packed and unpacked whole, and refused when foreign."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamdedup.kafka.verdict_records import VERDICTS_FORMAT, BatchVerdicts, NotAVerdictRecord


@given(
    first=st.integers(0, 2**62),
    length=st.integers(1, 2**20),
    leads=st.booleans(),
    closes=st.booleans(),
    stored=st.lists(st.booleans(), max_size=3000),
)
def test_a_batchs_verdicts_come_back_as_packed(
    first: int, length: int, leads: bool, closes: bool, stored: list[bool]
) -> None:
    packed = BatchVerdicts(first, first + length, leads, closes, np.array(stored, dtype=bool)).packed()
    back = BatchVerdicts.unpacked(packed)
    assert (back.first, back.end, back.leads, back.closes) == (first, first + length, leads, closes)
    assert back.stored.dtype == bool
    assert back.stored.tolist() == stored


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (None, "not a verdict record"),
        (b"\xc1", "not a verdict record"),
        (msgpack.packb({"format": 1}), "not a verdict record: dict"),
        (msgpack.packb([VERDICTS_FORMAT + 1, 0, 1, True, True, 0, b""]), f"format {VERDICTS_FORMAT + 1}"),
        (msgpack.packb([VERDICTS_FORMAT, 0, 1, True, 0, b""]), "6 fields"),
        (msgpack.packb([VERDICTS_FORMAT, 5, 5, True, True, 0, b""]), "offsets 5..5"),
        (msgpack.packb([VERDICTS_FORMAT, 0, 9, True, True, 9, b"\x00"]), "9 records"),
        (msgpack.packb([VERDICTS_FORMAT, 0, 9, True, False, 1, b"\x00\x00"]), "1 records"),
        (msgpack.packb([VERDICTS_FORMAT, "0", 9, True, True, 1, b"\x00"]), "offsets '0'..9"),
        (msgpack.packb([VERDICTS_FORMAT, 0, 9, 1, True, 1, b"\x00"]), "offsets 0..9"),
        (msgpack.packb([VERDICTS_FORMAT, 0, 9, True, 0, 1, b"\x00"]), "offsets 0..9"),
    ],
)
def test_a_record_that_is_not_a_verdict_record_is_refused_with_what_is_wrong(value: bytes | None, says: str) -> None:
    with pytest.raises(NotAVerdictRecord, match=says):
        BatchVerdicts.unpacked(value)
