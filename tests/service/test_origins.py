"""Origins: input read directly is its own origin; input read through the sequence topic gets an origin of its
own per record, which sorts by sequence offset, in the offsets the index keeps."""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from streamdedup.kafka.consumer import Unreadable
from streamdedup.kafka.sequence_records import SEQUENCE_POSITION_BITS, packed
from streamdedup.service.origins import Origins


def record(topic: str, partition: int, offset: int, value: bytes | None) -> ConsumerRecord:
    size = -1 if value is None else len(value)
    return ConsumerRecord(topic, partition, offset, 5_000, 0, None, value, None, -1, size, [])


def test_input_read_directly_is_its_own_origin_and_offsets_stay_as_they_are() -> None:
    fetched = [record("in", 2, 40, b"a"), record("in", 3, 7, b"b")]
    carried = Origins(sequenced=False).carried(fetched)
    assert carried.records == fetched
    assert carried.origins == [("in", 2, 40), ("in", 3, 7)]
    assert carried.signed is None
    assert Origins(sequenced=False).index_offset(41) == 41 == Origins(sequenced=False).kafka_offset(41)


def test_each_record_a_sequence_record_carries_gets_an_origin_of_its_own_below_the_next_sequence_offset() -> None:
    first = packed([record("in", 1, 10, b"x"), record("in", 1, 11, b"y")], 10_000)[0]
    second = packed([record("in", 0, 3, b"z")], 10_000)[0]
    fetched = [record("seq", 0, 8, first), record("seq", 0, 9, second)]
    origins = Origins(sequenced=True)
    records, carried = origins.carried(fetched).records, origins.carried(fetched).origins
    assert [(r.topic, r.partition, r.offset, r.value) for r in records] == [
        ("in", 1, 10, b"x"),
        ("in", 1, 11, b"y"),
        ("in", 0, 3, b"z"),
    ]
    base = 1 << SEQUENCE_POSITION_BITS
    assert carried == [("seq", 0, 8 * base), ("seq", 0, 8 * base + 1), ("seq", 0, 9 * base)]
    # The index keeps the offset after the batch; rolling back to a sequence offset removes whole records.
    assert origins.index_offset(10) == 10 * base > carried[-1][2]
    assert origins.index_offset(9) == carried[-1][2]
    assert origins.kafka_offset(origins.index_offset(10)) == 10


def test_a_record_of_the_sequence_topic_that_is_not_one_is_unreadable_at_its_own_offset() -> None:
    batch = Origins(sequenced=True).carried([record("seq", 0, 4, b"\xc1not msgpack")])
    records, carried = batch.records, batch.origins
    assert len(records) == 1 and isinstance(records[0], Unreadable)
    assert (records[0].topic, records[0].offset) == ("seq", 4)
    assert "not a sequence record" in str(records[0].error)
    assert carried == [("seq", 0, 4 << SEQUENCE_POSITION_BITS)]
