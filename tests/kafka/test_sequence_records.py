"""Sequence records: packed and unpacked whole, within the size they are given, and refused when foreign."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from hypothesis import given
from hypothesis import strategies as st

from streamdedup.kafka.consumer import Unreadable
from streamdedup.kafka.sequence_records import (
    SEQUENCE_POSITION_BITS,
    NotASequenceRecord,
    SignedRecords,
    UnparsedRecord,
    packed,
    unpacked,
)
from streamdedup.settings import DedupSettings, FingerprintSettings
from streamdedup.signature import Signer


def input_record(
    offset: int, value: bytes | None, key: bytes | None = None, headers: list | None = None
) -> ConsumerRecord:
    return ConsumerRecord(
        "news",
        4,
        offset,
        1_700_000_000_000 + offset,
        0,
        key,
        value,
        None,
        -1 if key is None else len(key),
        -1 if value is None else len(value),
        headers or [],
    )


def sequence_record(value: bytes, offset: int = 7) -> ConsumerRecord:
    return ConsumerRecord("seq", 0, offset, 0, 0, None, value, None, -1, len(value), [])


def fields(record: ConsumerRecord) -> tuple:
    return (
        record.topic,
        record.partition,
        record.offset,
        record.timestamp,
        record.key,
        record.value,
        [tuple(header) for header in record.headers],
    )


_bytes = st.one_of(st.none(), st.binary(max_size=300))
_headers = st.lists(st.tuples(st.text(max_size=10), st.binary(max_size=20)), max_size=3)


@given(st.lists(st.tuples(_bytes, _bytes, _headers), min_size=1, max_size=60), st.integers(2_000, 20_000))
def test_records_come_back_whole_and_in_order_within_the_limit(contents: list, limit: int) -> None:
    records = [input_record(100 + i, value, key, headers) for i, (value, key, headers) in enumerate(contents)]
    values = packed(records, limit)
    assert all(len(value) <= limit for value in values)
    back = [record for i, value in enumerate(values) for record in unpacked(sequence_record(value, i)).records]
    assert [fields(record) for record in back] == [fields(record) for record in records]


def test_one_record_a_sequence_record_when_each_fills_the_limit() -> None:
    records = [input_record(i, bytes(900)) for i in range(3)]
    assert [len(unpacked(sequence_record(value)).records) for value in packed(records, 2_000)] == [1, 1, 1]
    assert [len(unpacked(sequence_record(value)).records) for value in packed(records, 10_000)] == [3]


def test_a_record_its_client_could_not_parse_stays_unreadable_with_what_was_raised() -> None:
    unreadable = Unreadable.at(TopicPartition("news", 4), 12, UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"))
    back = unpacked(sequence_record(packed([input_record(11, b"ok"), unreadable], 10_000)[0])).records
    assert fields(back[0]) == fields(input_record(11, b"ok"))
    assert isinstance(back[1], Unreadable) and (back[1].topic, back[1].partition, back[1].offset) == ("news", 4, 12)
    assert isinstance(back[1].error, UnparsedRecord)
    assert str(back[1].error).startswith("UnicodeDecodeError: 'utf-8' codec can't decode")


def test_a_sequence_record_holds_fewer_records_than_its_positions_can_name() -> None:
    records = [input_record(i, None) for i in range((1 << SEQUENCE_POSITION_BITS) + 5)]
    sizes = [len(unpacked(sequence_record(value)).records) for value in packed(records, 1 << 30)]
    assert sizes == [1 << SEQUENCE_POSITION_BITS, 5]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"\xc1", "not a sequence record"),
        (msgpack.packb([1, 2, 3]), "not a sequence record"),
        (msgpack.packb([2, "news", 0, [], [], [], [], [], [], None]), "a sequence record of format 2"),
    ],
)
def test_what_is_not_a_sequence_record_of_this_format_is_refused(value: bytes, says: str) -> None:
    with pytest.raises(NotASequenceRecord, match=says):
        unpacked(sequence_record(value))


def test_signatures_travel_with_their_records_and_are_found_by_record() -> None:
    signer = Signer(FingerprintSettings(), DedupSettings())
    records = [input_record(i, b'{"text": "story %d of many words"}' % i) for i in range(30)]
    rows = [row for row in range(30) if row % 3]
    signatures = signer.sign([f"story {row} of many words" for row in rows])
    signed = SignedRecords.of("scheme x", 30, rows, signatures)
    values = packed(records, 4_000, signed)
    assert len(values) > 1  # split: each part carries its own rows
    parts = [unpacked(sequence_record(value, i)) for i, value in enumerate(values)]
    joined = SignedRecords.joined([part.signed for part in parts])
    assert joined is not None and joined.signing == "scheme x"
    assert joined.signed.tolist() == [row % 3 != 0 for row in range(30)]
    back = joined.of_rows(rows)
    assert back is not None
    np.testing.assert_array_equal(back.fingerprints, signatures.fingerprints)
    np.testing.assert_array_equal(back.sketches, signatures.sketches)
    assert back.errors == signatures.errors and back.empty.tolist() == signatures.empty.tolist()
    # A record that was not signed (it did not decode into a document) has no signature to give.
    assert joined.of_rows([0, 1]) is None
    # Parts signed otherwise, or not at all, join into nothing: the decider signs those batches itself.
    other = SignedRecords.of("scheme y", 1, [0], signer.sign(["another story"]))
    assert SignedRecords.joined([parts[0].signed, other]) is None
    assert SignedRecords.joined([parts[0].signed, None]) is None
    assert unpacked(sequence_record(packed(records[:2], 4_000)[0])).signed is None
