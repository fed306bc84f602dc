"""The input side: a group consumer that hands out batches in a fixed order and reports rebalances.

A record the Kafka client cannot parse (a header key that is not UTF-8) makes aiokafka raise from ``getmany``,
losing what that call had already drained and leaving the partition stuck on it. :meth:`BatchConsumer.batch`
then rewinds to what it last handed out, reads the partitions one by one to find the record, and hands it out
as an :class:`Unreadable` record (no key, value or headers) at its offset, so that the caller dead-letters it
and the partition goes on after it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord

from ..lifecycle import Lifecycle
from ..settings import KafkaSettings
from .clients import common_options

__all__ = [
    "BatchConsumer",
    "RebalanceHandler",
    "Unreadable",
    "committed_reader",
    "partition_fetch_bytes",
    "standalone_consumer",
]

log = logging.getLogger(__name__)

RebalanceHandler = Callable[[frozenset[TopicPartition]], Awaitable[None]]

# Stopping must not hang the service when the broker is gone (leaving the group needs the broker).
_STOP_TIMEOUT_SECONDS = 10.0
# Reading one partition alone while looking for a record the client cannot parse: a partition with records
# left answers within the broker's fetch wait (500 ms by default).
_PROBE_TIMEOUT_MS = 5_000


def partition_fetch_bytes(max_message_bytes: int) -> int:
    """Bytes a fetch reads of one partition: a record may be as large as the input allows (larger ones are
    dead-lettered, not stuck)."""
    return max(1_048_576, max_message_bytes + 65_536)


def standalone_consumer(settings: KafkaSettings, max_message_bytes: int) -> AIOKafkaConsumer:
    """A consumer outside any group (its partitions are assigned to it, and it commits nothing) that reads
    committed records, from the earliest on where it has no position, each up to ``max_message_bytes``."""
    return AIOKafkaConsumer(
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        fetch_max_bytes=settings.fetch_max_bytes,
        max_partition_fetch_bytes=partition_fetch_bytes(max_message_bytes),
        **common_options(settings),
    )


@dataclass
class Unreadable(ConsumerRecord):
    """A record the Kafka client could not parse: its position, and the ``error`` that parsing raised (no key,
    value or headers; its timestamp is when it was skipped)."""

    error: Exception | None = None

    @classmethod
    def at(cls, tp: TopicPartition, offset: int, error: Exception) -> Unreadable:
        return cls(tp.topic, tp.partition, offset, int(time.time() * 1000), 0, None, None, None, -1, -1, (), error)


class BatchConsumer(Lifecycle):
    """An ``AIOKafkaConsumer`` in the settings' group, offsets committed only through transactions.

    ``on_revoked`` is awaited before partitions go away (the service finishes its batch there);
    ``on_assigned`` after new ones arrive (the service reconciles its index there or soon after). ``assignors``:
    how the group's leader assigns partitions (aiokafka's round robin by default).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        max_message_bytes: int,
        on_assigned: RebalanceHandler,
        on_revoked: RebalanceHandler,
        assignors: Sequence[object] | None = None,
    ) -> None:
        self.settings = settings
        self._assignors = (RoundRobinPartitionAssignor,) if assignors is None else tuple(assignors)
        self._max_message_bytes = max_message_bytes
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._consumer: AIOKafkaConsumer | None = None
        # Per partition, the offset after the last record handed out (or the last seek): where to rewind to.
        self._next: dict[TopicPartition, int] = {}

    async def start(self) -> None:
        if self._consumer is not None:
            return
        s = self.settings
        consumer = AIOKafkaConsumer(
            group_id=s.group_id,
            group_instance_id=s.group_instance_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            # Input written by transactional producers: never process aborted records.
            isolation_level="read_committed",
            fetch_max_bytes=s.fetch_max_bytes,
            max_partition_fetch_bytes=partition_fetch_bytes(self._max_message_bytes),
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            partition_assignment_strategy=self._assignors,
            **common_options(s),
        )
        await consumer.start()
        self._consumer = consumer
        try:
            consumer.subscribe(s.input_topics, listener=_Listener(self._on_assigned, self._on_revoked))
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Idempotent; gives up leaving the group politely after a while (the broker may be down)."""
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        try:
            await asyncio.wait_for(consumer.stop(), _STOP_TIMEOUT_SECONDS)
        except (TimeoutError, OSError) as exc:
            log.warning("consumer did not stop cleanly: %r", exc)

    @property
    def client(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise RuntimeError("the consumer is not started")
        return self._consumer

    async def batch(self, *, wait: bool = True) -> list[ConsumerRecord]:
        """Up to ``batch_max_records`` records, partitions in (topic, partition) order, each in offset order.
        ``wait=False`` returns at once with what is already fetched (possibly nothing). Where a record cannot be
        parsed, the records of one partition up to it and the record as :class:`Unreadable`."""
        try:
            fetched = await self.client.getmany(
                timeout_ms=self.settings.batch_timeout_ms if wait else 0, max_records=self.settings.batch_max_records
            )
        except KafkaError:
            raise
        except Exception as exc:
            return await self._around_unreadable(exc)
        for tp, records in fetched.items():
            self._next[tp] = records[-1].offset + 1
        return [record for tp in sorted(fetched) for record in fetched[tp]]

    async def _around_unreadable(self, error: Exception) -> list[ConsumerRecord]:
        """After ``getmany`` raised parsing a record: the records of the first partition (in order) that has
        any, up to and including the record that cannot be parsed, which is then skipped."""
        client = self.client
        active = sorted(client.assignment() - client.paused())
        for tp in active:
            if tp in self._next:
                client.seek(tp, self._next[tp])  # what the failed call drained is lost with it
        log.warning("the Kafka client could not parse a record (%r); reading the partitions one by one", error)
        ends = await client.end_offsets(active)
        client.pause(*active)
        try:
            for tp in active:
                if await client.position(tp) >= ends[tp]:
                    continue
                client.resume(tp)
                try:
                    records = await self._read_alone(tp)
                finally:
                    client.pause(tp)
                if records:
                    return records
        finally:
            client.resume(*active)
        return []

    async def _read_alone(self, tp: TopicPartition) -> list[ConsumerRecord]:
        """The next records of ``tp``, fetched alone; one at a time once a read of them raised, up to the one
        that raises, which is returned as :class:`Unreadable` at the offset after the last readable one (a
        transaction marker just before it would take that offset: then the record follows it)."""
        try:
            fetched = await self.client.getmany(
                tp, timeout_ms=_PROBE_TIMEOUT_MS, max_records=self.settings.batch_max_records
            )
        except KafkaError:
            raise
        except Exception:
            return await self._up_to_unreadable(tp)
        records = fetched.get(tp, [])
        if records:
            self._next[tp] = records[-1].offset + 1
        return records

    async def _up_to_unreadable(self, tp: TopicPartition) -> list[ConsumerRecord]:
        client = self.client
        start = self._next.get(tp)
        if start is not None:
            client.seek(tp, start)
        readable: list[ConsumerRecord] = []
        while True:
            try:
                fetched = await client.getmany(tp, timeout_ms=_PROBE_TIMEOUT_MS, max_records=1)
            except KafkaError:
                raise
            except Exception as exc:
                offset = await client.position(tp)
                log.error(
                    "skipping the record at %s[%d] offset %d: the Kafka client cannot parse it (%r)",
                    tp.topic,
                    tp.partition,
                    offset,
                    exc,
                )
                client.seek(tp, offset + 1)
                self._next[tp] = offset + 1
                return [*readable, Unreadable.at(tp, offset, exc)]
            if not fetched.get(tp):
                return readable  # it read this time (a fetch that failed on the way, not the record)
            readable.extend(fetched[tp])
            self._next[tp] = readable[-1].offset + 1

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(self.client.assignment())

    def subscribed_partitions(self) -> frozenset[TopicPartition]:
        """Every partition of the input topics, as far as the consumer's metadata knows."""
        return frozenset(
            TopicPartition(topic, partition)
            for topic in self.settings.input_topics
            for partition in self.client.partitions_for_topic(topic) or ()
        )

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """Kafka-committed next offsets; None for a partition without one (never committed, or its group's
        offsets deleted or expired)."""
        return {tp: await self.client.committed(tp) for tp in sorted(partitions)}

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The earliest offset still in each partition."""
        return await self.client.beginning_offsets(list(partitions))

    def seek(self, offsets: Mapping[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            self.client.seek(tp, offset)
            self._next[tp] = offset

    async def position(self, partition: TopicPartition) -> int:
        """The offset of the next record this consumer will fetch from ``partition``."""
        position: int = await self.client.position(partition)
        return position

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self.client.pause(*partitions)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self.client.resume(*partitions)

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self.client.end_offsets(list(partitions))


class _Listener(ConsumerRebalanceListener):
    def __init__(self, on_assigned: RebalanceHandler, on_revoked: RebalanceHandler) -> None:
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self._on_revoked(frozenset(revoked))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        await self._on_assigned(frozenset(assigned))


@asynccontextmanager
async def committed_reader(bootstrap: str, topic: str) -> AsyncIterator[tuple[AIOKafkaConsumer, TopicPartition]]:
    """A consumer reading partition 0 of ``topic`` from the start as downstream sees it (read_committed)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        yield consumer, tp
    finally:
        await consumer.stop()
