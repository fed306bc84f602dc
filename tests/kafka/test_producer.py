"""The transactional producer on the real broker: records and input offsets land together or not at all."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError, ProducerFenced

from streamdedup.kafka.admin import admin_client
from streamdedup.kafka.producer import TransactionalProducer
from streamdedup.kafka.records import OutgoingRecord
from streamdedup.settings import KafkaSettings

from ..conftest import Consume

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., Awaitable[str]]


def _settings(bootstrap: str, **overrides: object) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=bootstrap, transactional_id=f"producer-test-{uuid.uuid4().hex[:8]}", **overrides)


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
    assert [(r.value, list(r.headers)) for r in copied] == [(b"copy", [("match-id", b"first"), ("match-distance", b"3")])]
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
        with pytest.raises(ProducerFenced):
            await old.publish([OutgoingRecord(output, b"zombie", None, ())], {TopicPartition(source, 0): 2}, group)
        await new.publish([OutgoingRecord(output, b"new", None, ())], {TopicPartition(source, 0): 2}, group)
    finally:
        await old.stop()
        await new.stop()
        await new.stop()
    assert [r.value for r in await kafka_consume(output)] == [b"old", b"new"]
    assert await _committed(kafka_bootstrap, group) == {TopicPartition(source, 0): 2}


async def test_publishing_needs_a_started_producer(kafka_bootstrap: str) -> None:
    producer = TransactionalProducer(_settings(kafka_bootstrap))
    with pytest.raises(RuntimeError, match="not started"):
        await producer.publish([], {}, "group")
