"""The input side: a group consumer that hands out batches in a fixed order and reports rebalances."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import ConsumerRecord

from ..lifecycle import Lifecycle
from ..settings import KafkaSettings
from .clients import common_options

__all__ = ["BatchConsumer", "RebalanceHandler", "committed_reader"]

log = logging.getLogger(__name__)

RebalanceHandler = Callable[[frozenset[TopicPartition]], Awaitable[None]]

# Stopping must not hang the service when the broker is gone (leaving the group needs the broker).
_STOP_TIMEOUT_SECONDS = 10.0


class BatchConsumer(Lifecycle):
    """An ``AIOKafkaConsumer`` in the settings' group, offsets committed only through transactions.

    ``on_revoked`` is awaited before partitions go away (the service finishes its batch there);
    ``on_assigned`` after new ones arrive (the service reconciles its index there or soon after).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        max_message_bytes: int,
        on_assigned: RebalanceHandler,
        on_revoked: RebalanceHandler,
    ) -> None:
        self.settings = settings
        self._max_message_bytes = max_message_bytes
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._consumer: AIOKafkaConsumer | None = None

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
            # One record may be as large as the input allows (larger ones are dead-lettered, not stuck).
            max_partition_fetch_bytes=max(1_048_576, self._max_message_bytes + 65_536),
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
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
        ``wait=False`` returns at once with what is already fetched (possibly nothing)."""
        fetched = await self.client.getmany(
            timeout_ms=self.settings.batch_timeout_ms if wait else 0, max_records=self.settings.batch_max_records
        )
        return [record for tp in sorted(fetched) for record in fetched[tp]]

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(self.client.assignment())

    def subscribed_partitions(self) -> frozenset[TopicPartition]:
        """Every partition of the input topics, as far as the consumer's metadata knows."""
        return frozenset(
            TopicPartition(topic, partition)
            for topic in self.settings.input_topics
            for partition in self.client.partitions_for_topic(topic) or ()
        )

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Kafka-committed next offsets; partitions never committed get their earliest available offset."""
        partitions = sorted(partitions)
        result: dict[TopicPartition, int] = {}
        missing = []
        for tp in partitions:
            offset = await self.client.committed(tp)
            if offset is None:
                missing.append(tp)
            else:
                result[tp] = offset
        if missing:
            result.update(await self.client.beginning_offsets(missing))
        return result

    def seek(self, offsets: Mapping[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            self.client.seek(tp, offset)

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


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
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
