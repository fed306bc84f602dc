"""The transactional producer on the real broker: records and input offsets land together or not at all."""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import Awaitable, Callable

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError, ProducerFenced

from streamdedup.kafka.admin import admin_client
from streamdedup.kafka.producer import TransactionalProducer, send_batched
from streamdedup.kafka.records import OutgoingRecord
from streamdedup.settings import KafkaSettings

from ..conftest import Consume, OutRecord, Produce

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., Awaitable[str]]


def _settings(bootstrap: str, **overrides: object) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=bootstrap, transactional_id=f"producer-test-{uuid.uuid4().hex[:8]}", **overrides
    )


async def _committed(bootstrap: str, group: str) -> dict[TopicPartition, int]:
    async with admin_client(bootstrap_servers=bootstrap) as admin:
        offsets = await admin.list_consumer_group_offsets(group)
    return {tp: meta.offset for tp, meta in offsets.items()}


async def test_records_to_several_topics_and_the_offsets_commit_together(
    kafka_bootstrap: str, topic_factory: TopicFactory, kafka_consume: Consume
) -> None:
    output, duplicates, source = await topic_factory(), await topic_factory(), await topic_factory(partitions=2)
    records = [
        OutgoingRecord(output, b"first", b"k1", (("fingerprint", b"00ff"),)),
        OutgoingRecord(duplicates, b"copy", None, (("match-id", b"first"), ("match-distance", b"3"))),
        OutgoingRecord(output, b"second", None, ()),
    ]
    offsets = {TopicPartition(source, 0): 7, TopicPartition(source, 1): 2}
    group = f"producer-test-{uuid.uuid4().hex[:8]}"
    async with TransactionalProducer(_settings(kafka_bootstrap)) as producer:
        commit_seconds = await producer.publish(records, offsets, group)
        assert producer.ready
    assert not producer.ready
    assert 0 < commit_seconds < 30
    published = await kafka_consume(output)
    assert [(r.value, r.key, list(r.headers)) for r in published] == [
        (b"first", b"k1", [("fingerprint", b"00ff")]),
        (b"second", None, []),
    ]
    copied = await kafka_consume(duplicates)
    assert [(r.value, list(r.headers)) for r in copied] == [
        (b"copy", [("match-id", b"first"), ("match-distance", b"3")])
    ]
    assert await _committed(kafka_bootstrap, group) == offsets


async def test_a_record_that_cannot_be_sent_aborts_the_whole_batch_and_the_next_one_lands(
    kafka_bootstrap: str, topic_factory: TopicFactory, kafka_consume: Consume
) -> None:
    output, source = await topic_factory(), await topic_factory()
    group = f"producer-test-{uuid.uuid4().hex[:8]}"
    too_big = OutgoingRecord(output, b"x" * 8192, None, ())
    async with TransactionalProducer(_settings(kafka_bootstrap, max_request_bytes=4096)) as producer:
        with pytest.raises(MessageSizeTooLargeError):
            await producer.publish(
                [OutgoingRecord(output, b"sent before", None, ()), too_big], {TopicPartition(source, 0): 2}, group
            )
        assert await _committed(kafka_bootstrap, group) == {}
        await producer.publish([OutgoingRecord(output, b"next batch", None, ())], {TopicPartition(source, 0): 3}, group)
    # The aborted record is in the log, but read_committed readers never see it.
    assert [r.value for r in await kafka_consume(output)] == [b"next batch"]
    assert len(await kafka_consume(output, isolation_level="read_uncommitted")) == 2
    assert await _committed(kafka_bootstrap, group) == {TopicPartition(source, 0): 3}


async def test_a_new_producer_with_the_same_id_fences_the_old_one(
    kafka_bootstrap: str, topic_factory: TopicFactory, kafka_consume: Consume
) -> None:
    output, source = await topic_factory(), await topic_factory()
    group = f"producer-test-{uuid.uuid4().hex[:8]}"
    settings = _settings(kafka_bootstrap)
    old, new = TransactionalProducer(settings), TransactionalProducer(settings)
    await old.start()
    try:
        await old.publish([OutgoingRecord(output, b"old", None, ())], {TopicPartition(source, 0): 1}, group)
        await new.start()
        with pytest.raises(ProducerFenced) as fenced:
            await old.publish([OutgoingRecord(output, b"zombie", None, ())], {TopicPartition(source, 0): 2}, group)
        await new.publish([OutgoingRecord(output, b"new", None, ())], {TopicPartition(source, 0): 2}, group)
    finally:
        await old.stop()
        await new.stop()
        await new.stop()
    # aiokafka leaves futures of the fenced producer failed and never retrieved, held with the error's frames.
    # Let them go now: asyncio logs them with a traceback, whose ast.parse (Python 3.11) breaks one it interrupts
    # if a later collection lands inside pytest's import of a module.
    del fenced
    gc.collect()
    assert [r.value for r in await kafka_consume(output)] == [b"old", b"new"]
    assert await _committed(kafka_bootstrap, group) == {TopicPartition(source, 0): 2}


async def test_publishing_needs_a_started_producer(kafka_bootstrap: str) -> None:
    producer = TransactionalProducer(_settings(kafka_bootstrap))
    with pytest.raises(RuntimeError, match="not started"):
        await producer.publish([], {}, "group")


async def test_batched_records_keep_their_order_and_the_partition_of_their_key(
    kafka_bootstrap: str, topic_factory: TopicFactory, kafka_produce: Produce, kafka_consume: Consume
) -> None:
    by_send, batched = await topic_factory(partitions=3), await topic_factory(partitions=3)
    keys = [f"user-{i % 17}".encode() for i in range(300)]
    values = [f"record {i} ".encode() * 4 for i in range(300)]
    await kafka_produce(by_send, [OutRecord(value, key=key) for key, value in zip(keys, values, strict=True)])
    # Batches of at most 4 kB: the 300 records need several per partition.
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, max_batch_size=4096)
    await producer.start()
    try:
        records = [OutgoingRecord(batched, value, key, ()) for key, value in zip(keys, values, strict=True)]
        deliveries = await send_batched(producer, records, 1_048_576)
        await asyncio.gather(*deliveries)
    finally:
        await producer.stop()
    assert len(deliveries) > 3
    sent = await kafka_consume(by_send)
    landed = await kafka_consume(batched)
    # Where aiokafka's own send puts a key, the batches put it too, at the same offset: in the order given.
    assert [(r.partition, r.offset, r.key, r.value) for r in landed] == [
        (r.partition, r.offset, r.key, r.value) for r in sent
    ]
    assert len({r.partition for r in landed}) == 3


async def test_records_without_a_key_share_a_partition_and_may_have_no_value_either(
    kafka_bootstrap: str, topic_factory: TopicFactory, kafka_consume: Consume
) -> None:
    topic = await topic_factory(partitions=4)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        records = [OutgoingRecord(topic, f"{i}".encode(), None, ()) for i in range(20)]
        # Kafka takes a record with neither key nor value (aiokafka's send refuses it): a dead letter can be one.
        records.append(OutgoingRecord(topic, None, None, (("reason", b"null_value"),)))
        await asyncio.gather(*await send_batched(producer, records, 1_048_576))
    finally:
        await producer.stop()
    landed = await kafka_consume(topic)
    assert len({r.partition for r in landed}) == 1
    assert [r.value for r in landed] == [f"{i}".encode() for i in range(20)] + [None]
    assert (landed[-1].key, list(landed[-1].headers)) == (None, [("reason", b"null_value")])
