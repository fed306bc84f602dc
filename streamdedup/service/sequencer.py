"""The sequencing role of a scaled-out deployment: its share of the input, packed into the sequence topic.

Every instance runs one. They share the input as one consumer group (``kafka.group_id``), and each appends the
records of the partitions it holds to the one-partition sequence topic, a packed batch per partition at a time
(:mod:`..kafka.sequence_records`). The sequence topic's order is then the order in which the deciding instance
decides: near-copies that arrive at the same moment on different partitions are decided one after the other.

Signing needs no shared state, so it happens here: the sequencer decodes each batch, has the signing workers sign
its documents, and packs their signatures with the records. The decider and its standbys key and decide them.

Exactly once: each input partition has a transactional id of its own, and a batch's sequence records commit in
one Kafka transaction with the partition's offset after them. Whoever takes a partition over starts a producer
under its id first, which fences the instance that had it (frozen or not) and ends that one's open transaction,
and only then reads where the partition resumes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import cast

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError, ProducerFenced
from aiokafka.structs import ConsumerRecord

from ..document import Document, DocumentDecoder
from ..kafka.admin import admin_client, ensure_topics, partition_counts, wait_for_group_coordinator
from ..kafka.clients import common_options
from ..kafka.consumer import BatchConsumer
from ..kafka.producer import TransactionalProducer
from ..kafka.records import OutgoingRecord, decoded_records, topic_record_limits
from ..kafka.sequence_records import SignedRecords, packed
from ..lifecycle import Lifecycle, StopRequest
from ..metrics import ServiceMetrics
from ..settings import ConfigError, Settings
from ..signature import Signer, signing_id
from .backoff import Backoff
from .signer_supervisor import SignerSupervisor

__all__ = ["Sequencer", "prepare_sequence_topic", "sequence_topic_configs"]

log = logging.getLogger(__name__)

# A day beyond the index's horizon: a rebuilt index replays what it would still hold, and a little more.
_RETENTION_MARGIN_MS = 86_400_000


def sequence_topic_configs(settings: Settings) -> dict[str, str]:
    """The sequence topic's configuration: records as large as a packed batch, and kept as long as the index
    keeps what they carry (``index.max_age_seconds``; forever without one), so that an index can be rebuilt
    from the topic alone."""
    max_age = settings.index.max_age_seconds
    retention = -1 if max_age is None else int(max_age * 1000) + _RETENTION_MARGIN_MS
    return {"max.message.bytes": str(settings.kafka.max_request_bytes), "retention.ms": str(retention)}


async def prepare_sequence_topic(admin: AIOKafkaAdminClient, settings: Settings) -> int:
    """Create the sequence topic and its verdicts topic if they are missing (when ``kafka.create_topics``) and
    check that each has one partition; the largest record the sequence topic takes. Both roles call it before
    they subscribe: a consumer that subscribes to a topic before it exists sees it only at its next metadata
    refresh, minutes later."""
    kafka = settings.kafka
    topic, verdicts = kafka.sequence_topic, kafka.verdicts_topic
    if topic is None or verdicts is None:
        raise ValueError("no kafka.sequence_topic")
    if kafka.create_topics:
        # The verdicts are kept as long as the batches they are of.
        configs = sequence_topic_configs(settings)
        await ensure_topics(
            admin,
            {topic: 1, verdicts: 1},
            replication_factor=kafka.topic_replication_factor,
            configs={topic: configs, verdicts: configs},
        )
    counts = await partition_counts(admin, [topic, verdicts])
    for name, role in ((topic, "its order is the order of every decision"), (verdicts, "it follows that order")):
        partitions = counts.get(name)
        if partitions is not None and partitions != 1:
            raise ConfigError(f"the topic {name} has {partitions} partitions: it must have exactly one ({role})")
    return (await topic_record_limits(admin, [topic], kafka.max_request_bytes))[topic]


class Sequencer(Lifecycle):
    """``start()`` launches the sequencing loop; ``stop()`` finishes the batch in flight and closes. A Kafka error
    ends a session (its clients); the next one starts after a pause."""

    def __init__(self, settings: Settings, metrics: ServiceMetrics, signers: SignerSupervisor) -> None:
        topic = settings.kafka.sequence_topic
        if topic is None:
            raise ValueError("a sequencer needs kafka.sequence_topic")
        self._settings = settings
        self._signers = signers
        self._decoder = DocumentDecoder(settings.input)
        self._signing = signing_id(settings.fingerprint, settings.dedup)
        # Signs in a thread while there are no signing workers.
        self._signer = Signer(settings.fingerprint, settings.dedup)
        self._topic = topic
        self._metrics = metrics
        self._stop = StopRequest()
        self._task: asyncio.Task[None] | None = None
        # Per input partition held: its producer, and the offset of the next record to sequence.
        self._producers: dict[TopicPartition, TransactionalProducer] = {}
        self._next: dict[TopicPartition, int] = {}
        self._consumer: BatchConsumer | None = None
        self._limit = 0
        # What the rebalance listener could not do (a producer that would not start): it ends the session, as a
        # partition held without a producer would never be sequenced.
        self._listener_failure: Exception | None = None
        # Held while a batch is sequenced and while the assignment changes: a partition moves between batches.
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        if self._task is None:
            self._stop = StopRequest()
            self._task = asyncio.create_task(self._main(), name="streamdedup-sequencer")

    async def stop(self) -> None:
        """Idempotent: the batch in flight commits (or aborts), the producers and the consumer close. What ended
        the loop before, if anything, is for ``wait()`` to raise."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            await asyncio.wait([task])

    async def wait(self) -> None:
        """Return when the loop ends (after ``stop()``), and raise what ended it otherwise."""
        if self._task is None:
            raise RuntimeError("the sequencer is not started")
        await asyncio.shield(self._task)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _main(self) -> None:
        kafka = self._settings.kafka
        backoff = Backoff(kafka.retry_backoff_seconds, kafka.retry_backoff_max_seconds)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                await self._session()
            except (KafkaError, OSError, TimeoutError) as exc:
                if time.monotonic() - started > kafka.retry_backoff_max_seconds:
                    backoff.reset()
                pause = backoff.pause()
                # A fenced producer means another instance took its partition over: this one rejoins the group.
                what = "fenced" if isinstance(exc, ProducerFenced) else "Kafka error"
                log.warning("sequencer: %s (%r); recreating the clients in %.1f s", what, exc, pause)
                await self._stop.sleep(pause)

    async def _session(self) -> None:
        kafka = self._settings.kafka
        self._limit = await self._prepare_topic()
        consumer = BatchConsumer(
            kafka,
            max_message_bytes=self._settings.input.max_message_bytes,
            on_assigned=self._assigned,
            on_revoked=self._revoked,
        )
        self._consumer = consumer
        self._listener_failure = None
        try:
            async with consumer:
                while not self._stop.is_set():
                    records = await consumer.batch()
                    if self._listener_failure is not None:
                        raise self._listener_failure
                    if records:
                        async with self._lock:
                            await self._sequence(records)
        finally:
            self._consumer = None
            async with self._lock:
                await self._close(list(self._producers))

    async def _prepare_topic(self) -> int:
        """The sequence topic ready (:func:`prepare_sequence_topic`) and the cluster able to coordinate the group;
        the largest record the topic takes."""
        kafka = self._settings.kafka
        async with admin_client(**common_options(kafka)) as admin:
            limit = await prepare_sequence_topic(admin, self._settings)
            await wait_for_group_coordinator(admin, kafka.group_id, timeout=kafka.request_timeout_ms / 1000)
        return limit

    async def _sequence(self, records: Sequence[ConsumerRecord]) -> None:
        """One transaction per input partition held: its records' sequence records and its next offset."""
        batches = []
        for tp, partition_records in groupby(
            records, key=lambda record: TopicPartition(record.topic, record.partition)
        ):
            start = self._next.get(tp)
            if start is None:
                continue  # fetched before the partition was taken over here: fetched again from where it resumes
            fresh = [record for record in partition_records if record.offset >= start]
            if fresh:
                batches.append(self._sequenced(tp, fresh))
        await asyncio.gather(*batches)

    async def _sequenced(self, tp: TopicPartition, records: list[ConsumerRecord]) -> None:
        kafka = self._settings.kafka
        signed = await self._signed(records)
        outgoing = [OutgoingRecord(self._topic, value, None, ()) for value in packed(records, self._limit, signed)]
        next_offset = records[-1].offset + 1
        async with asyncio.timeout(kafka.transaction_timeout_ms / 1000):
            await self._producers[tp].publish(outgoing, {tp: next_offset}, kafka.group_id)
        self._next[tp] = next_offset
        self._metrics.record_sequenced(tp.topic, len(records), len(outgoing))

    async def _signed(self, records: list[ConsumerRecord]) -> SignedRecords:
        """The signatures of the documents these records decode into (the decider decodes them alike)."""
        decoded = decoded_records(self._decoder, records)
        rows = [row for row, item in enumerate(decoded) if type(item) is Document]
        texts = [cast(Document, decoded[row]).text for row in rows]
        signatures = await self._signers.signatures(self._signers.submit(texts))
        if signatures is None:
            signatures = await asyncio.to_thread(self._signer.sign, texts)
        return SignedRecords.of(self._signing, len(records), rows, signatures)

    async def _assigned(self, assigned: frozenset[TopicPartition]) -> None:
        async with self._lock:
            new = sorted(assigned - self._producers.keys())
            try:
                for tp in new:
                    kafka = self._settings.kafka
                    transactional_id = kafka.sequencer_transactional_id(tp.topic, tp.partition)
                    producer = TransactionalProducer(kafka.model_copy(update={"transactional_id": transactional_id}))
                    await producer.start()
                    self._producers[tp] = producer
                # Read once the producers fenced whoever had the partitions: their last transactions are settled.
                if new and self._consumer is not None:
                    await self._resume(self._consumer, new)
            except (KafkaError, OSError, TimeoutError) as exc:
                self._listener_failure = exc
                return
            self._metrics.record_roles(sequencing=len(self._producers))
            if new:
                log.info("sequencing %s", ", ".join(f"{tp.topic}[{tp.partition}]" for tp in new))

    async def _resume(self, consumer: BatchConsumer, partitions: Sequence[TopicPartition]) -> None:
        committed = await consumer.committed(partitions)
        earliest = await consumer.beginning_offsets([tp for tp, offset in committed.items() if offset is None])
        offsets: Mapping[TopicPartition, int] = {
            tp: offset if offset is not None else earliest[tp] for tp, offset in committed.items()
        }
        consumer.seek(offsets)
        self._next.update(offsets)

    async def _revoked(self, revoked: frozenset[TopicPartition]) -> None:
        # Under the lock: the batch in flight commits before its partitions move.
        async with self._lock:
            await self._close(sorted(revoked & self._producers.keys()))
            self._metrics.record_roles(sequencing=len(self._producers))

    async def _close(self, partitions: Sequence[TopicPartition]) -> None:
        for tp in partitions:
            self._next.pop(tp, None)
            await self._producers.pop(tp).stop()
