"""Shared pytest fixtures. Each helper adds its own section; keep sections separate."""

from __future__ import annotations

# --- Kafka: one real broker per session, topic/produce/consume factories (Kafka helper) -------------------
import asyncio
import functools
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import ConsumerRecord

from streamdedup.kafka.admin import ensure_topics, partition_counts
from streamdedup.kafka.broker import LocalBroker


@dataclass(frozen=True, slots=True)
class OutRecord:
    """A record to produce in a test; ``partition`` None lets the key decide."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None
    timestamp_ms: int | None = None


Produce = Callable[..., Awaitable[None]]
Consume = Callable[..., Awaitable[list[ConsumerRecord]]]


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a real Kafka broker: $KAFKA_BOOTSTRAP_SERVERS, else a local one for the session."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    broker = LocalBroker(tmp_path_factory.mktemp("kafka"))
    bootstrap = broker.start()
    try:
        yield bootstrap
    finally:
        broker.stop()


@pytest.fixture
async def topic_factory(kafka_bootstrap: str) -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """``await topic_factory(partitions=1, prefix="t")`` creates a topic with a unique name and returns it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    created: list[str] = []

    async def create(partitions: int = 1, *, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        await ensure_topics(admin, {name: partitions})
        created.append(name)
        return name

    try:
        yield create
    finally:
        if created:
            await admin.delete_topics(created)
        await admin.close()


async def produce_records(
    bootstrap: str, topic: str, records: Sequence[OutRecord | bytes | None], **producer_options: object
) -> None:
    """Send OutRecords (or bare values) to ``topic`` and wait for every acknowledgement."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, **producer_options)
    await producer.start()
    try:
        sent = []
        for record in records:
            if not isinstance(record, OutRecord):
                record = OutRecord(record)
            sent.append(
                await producer.send(
                    topic,
                    record.value,
                    key=record.key,
                    partition=record.partition,
                    headers=list(record.headers),
                    timestamp_ms=record.timestamp_ms,
                )
            )
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def consume_records(
    bootstrap: str,
    topic: str,
    *,
    count: int | None = None,
    isolation_level: str = "read_committed",
    timeout: float = 30.0,
) -> list[ConsumerRecord]:
    """Every partition of ``topic`` from the beginning, without a group, ordered by (partition, offset).

    With ``count`` it waits until that many records arrived (TimeoutError otherwise); without, it reads up to
    the end offsets seen at the start.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        partition_count = (await partition_counts(admin, [topic]))[topic]
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(partition_count)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        end = await consumer.end_offsets(partitions)
        records: list[ConsumerRecord] = []
        async with asyncio.timeout(timeout):
            while True:
                if count is not None and len(records) >= count:
                    break
                if count is None and all([await consumer.position(tp) >= end[tp] for tp in partitions]):
                    break
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    records.extend(batch)
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        await consumer.stop()


@pytest.fixture
def kafka_produce(kafka_bootstrap: str) -> Produce:
    """``await kafka_produce(topic, records)``: :func:`produce_records` on the session broker."""
    return functools.partial(produce_records, kafka_bootstrap)


@pytest.fixture
def kafka_consume(kafka_bootstrap: str) -> Consume:
    """``await kafka_consume(topic, count=None, isolation_level="read_committed", timeout=30)``:
    :func:`consume_records` on the session broker."""
    return functools.partial(consume_records, kafka_bootstrap)


# --- end of the Kafka section -----------------------------------------------------------------------------


# --- Processes: what /proc says of a process (worker tests) -------------------------------------------------
def process_state(pid: int) -> str | None:
    """The process's state letter in /proc (R, S, D, Z, ...), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def process_running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped by whoever inherited it."""
    return process_state(pid) not in (None, "Z")


# --- The decision core: a bug that one document sets off --------------------------------------------------
from streamdedup.decide import Deduplicator  # noqa: E402


def plant_decision_bug(monkeypatch: pytest.MonkeyPatch, poison_id: str, message: str) -> None:
    """Make the decision core's lookup raise ZeroDivisionError(``message``) for any batch holding ``poison_id``."""
    real = Deduplicator._stored_matches

    def broken(self: Deduplicator, ids: list[str], *args: object) -> object:
        if poison_id in ids:
            raise ZeroDivisionError(message)
        return real(self, ids, *args)

    monkeypatch.setattr(Deduplicator, "_stored_matches", broken)
