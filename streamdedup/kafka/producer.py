"""The output side: one Kafka transaction per batch holding the published records and the input offsets."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, ProducerFenced
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder

from ..lifecycle import Lifecycle
from ..settings import KafkaSettings
from .clients import common_options
from .records import OutgoingRecord

__all__ = ["TransactionalProducer", "send_batched"]

log = logging.getLogger(__name__)

_PARTITIONER = DefaultPartitioner()

_STOP_TIMEOUT_SECONDS = 10.0


class TransactionalProducer(Lifecycle):
    """An idempotent, transactional ``AIOKafkaProducer`` under ``KafkaSettings.producer_transactional_id``.

    Starting it fences any earlier producer with the same id and completes (aborts) its open transaction,
    so after ``start()`` the input offsets committed in Kafka are final.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        if self._producer is not None:
            return
        s = self.settings
        producer = AIOKafkaProducer(
            transactional_id=s.producer_transactional_id,
            enable_idempotence=True,
            acks="all",
            linger_ms=s.linger_ms,
            max_batch_size=min(1_048_576, s.max_request_bytes),
            max_request_size=s.max_request_bytes,
            transaction_timeout_ms=s.transaction_timeout_ms,
            **common_options(s),
        )
        try:
            await producer.start()
        except BaseException:
            await _stop_quietly(producer)
            raise
        self._producer = producer

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Leaving on a Kafka, network or timeout error raises ``ProducerFenced`` instead when this producer was
        fenced: the caller's next producer would fence the instance that replaced this one (an instance frozen
        past its timeouts wakes up to such errors first)."""
        try:
            if isinstance(exc, (KafkaError, OSError, TimeoutError)) and not isinstance(exc, ProducerFenced):
                await self._check_after_failure()
        finally:
            await self.stop()

    async def _check_after_failure(self) -> None:
        try:
            async with asyncio.timeout(self.settings.request_timeout_ms / 1000):
                await self.check_not_fenced()
        except ProducerFenced:
            raise
        except Exception as exc:
            log.info("could not check whether the producer was fenced: %s", repr(exc))

    async def stop(self) -> None:
        """Idempotent; an open transaction is left for the broker (or the next producer) to abort."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await _stop_quietly(producer)

    @property
    def ready(self) -> bool:
        return self._producer is not None

    async def publish(
        self, records: Sequence[OutgoingRecord], offsets: Mapping[TopicPartition, int], group_id: str
    ) -> float:
        """Send ``records`` and commit ``offsets`` for ``group_id`` atomically; return the commit's seconds.

        On any error the transaction is aborted (when the broker still answers) and the error re-raised.
        """
        if self._producer is None:
            raise RuntimeError("the producer is not started")
        producer = self._producer
        await producer.begin_transaction()
        try:
            await asyncio.gather(*await send_batched(producer, records, self.settings.max_request_bytes))
            await producer.send_offsets_to_transaction(dict(offsets), group_id)
            started = time.perf_counter()
            await producer.commit_transaction()
            return time.perf_counter() - started
        except BaseException:
            await self._abort(producer)
            raise

    async def check_not_fenced(self) -> None:
        """Raise ``ProducerFenced`` when another producer took this one's transactional id after it started.

        An instance frozen past its timeouts learns it here instead of at its next batch, which may never come
        (it idles while the instance that replaced it holds the partitions). The probe is a transaction the
        broker checks the producer's epoch for: an offset of the first input partition for the group, then an
        abort, so nothing is committed.
        """
        if self._producer is None:
            raise RuntimeError("the producer is not started")
        producer = self._producer
        await producer.begin_transaction()
        try:
            partition = TopicPartition(self.settings.input_topics[0], 0)
            await producer.send_offsets_to_transaction({partition: 0}, self.settings.group_id)
        finally:
            await self._abort(producer)

    async def _abort(self, producer: AIOKafkaProducer) -> None:
        try:
            await asyncio.wait_for(producer.abort_transaction(), self.settings.request_timeout_ms / 1000)
        except Exception as exc:  # the original error matters more; the next producer aborts for us anyway
            # Its text, not the error: a log record holding the error would keep the failed producer alive.
            log.warning("could not abort the Kafka transaction: %s", repr(exc))


async def send_batched(
    producer: AIOKafkaProducer, records: Iterable[OutgoingRecord], max_record_bytes: int
) -> list[asyncio.Future[Any]]:
    """Queue ``records`` in record batches of their partitions, in order; one delivery future per batch.

    ``AIOKafkaProducer.send`` does the same work per record, in coroutines, with a future (and a result) for
    each: several microseconds of the event loop a record. Partitions are chosen as aiokafka's default
    partitioner does (a key's murmur2 hash), except that a topic's records without a key share one randomly
    chosen partition per call instead of a random one each. A record over ``max_record_bytes`` raises
    ``MessageSizeTooLargeError``, as ``send`` does. Await every future returned (``asyncio.gather`` takes
    the failures of the others when one fails).
    """
    partitions: dict[str, list[int]] = {}
    keyless: dict[str, int] = {}
    batches: dict[TopicPartition, BatchBuilder] = {}
    deliveries: list[asyncio.Future[Any]] = []
    try:
        for record in records:
            topic, key = record.topic, record.key
            if topic not in partitions:
                partitions[topic] = sorted(await producer.partitions_for(topic))
                keyless[topic] = random.choice(partitions[topic])
            choices = partitions[topic]
            # A key needs aiokafka's murmur2 (pure Python, ~4 us) only where there is a choice.
            partition = keyless[topic] if key is None or len(choices) == 1 else _PARTITIONER(key, choices, choices)
            tp = TopicPartition(topic, partition)
            batch = batches.get(tp)
            if batch is None:
                batch = batches[tp] = producer.create_batch()
            headers = list(record.headers)
            appended = batch.append(timestamp=None, key=key, value=record.value, headers=headers)
            if appended is None:
                # The batch is full: send it and start the next one, which takes any record.
                deliveries.append(await producer.send_batch(batch, topic, partition=partition))
                batch = batches[tp] = producer.create_batch()
                appended = batch.append(timestamp=None, key=key, value=record.value, headers=headers)
            if appended.size > max_record_bytes:
                raise MessageSizeTooLargeError(
                    f"a record of {appended.size} bytes for {topic} is over the maximum request size "
                    f"({max_record_bytes})"
                )
        for tp, batch in batches.items():
            deliveries.append(await producer.send_batch(batch, tp.topic, partition=tp.partition))
    except BaseException:
        # The caller never gets these: their failures are taken here, or asyncio reports them as never retrieved
        # (aiokafka leaves that to the user of its batch API).
        for delivery in deliveries:
            delivery.add_done_callback(_retrieve_failure)
        raise
    return deliveries


def _retrieve_failure(delivery: asyncio.Future[Any]) -> None:
    if not delivery.cancelled():
        delivery.exception()


async def _stop_quietly(producer: AIOKafkaProducer) -> None:
    try:
        await asyncio.wait_for(producer.stop(), _STOP_TIMEOUT_SECONDS)
    except (TimeoutError, OSError) as exc:
        log.warning("producer did not stop cleanly: %s", repr(exc))
