"""Reconciliation: the index brought in line with Kafka's committed offsets on every assignment.

LMDB commits first, so the index is never behind Kafka; when Kafka did not commit (crash, outage), the index is
rolled back to the committed offsets and the batches are fetched and decided again (with the same verdicts, but
where a candidate bound binds and the batches are cut elsewhere: none of them was published). An
index behind Kafka (lost, replaced, new) replays what it lacks, publishing nothing; scaled out, it stores what the
decider's verdict records say the decider stored (:mod:`.follower`). Where Kafka has no offset,
the partition resumes where the index is, and that offset is committed before anything is decided: from then
on Kafka has one, so a batch the index holds but Kafka never committed is always rolled back.

One instance must own every input partition (the index is local to it). A partial assignment means another
instance joined the group: the service says so loudly and processes nothing until it owns everything again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from aiokafka import TopicPartition

from ..decision_process import DecisionProcess
from ..kafka.consumer import BatchConsumer
from ..kafka.producer import TransactionalProducer
from ..lifecycle import StopRequest
from ..metrics import ServiceMetrics
from ..settings import Settings
from .batch_pipeline import BatchPipeline
from .follower import Follower
from .partition_ownership import Ownership, PartitionOwnership

__all__ = ["Reconciler"]

log = logging.getLogger(__name__)


class Reconciler:
    """The consumer's rebalance listener (``on_assigned``, ``on_revoked``) and ``reconcile``, which the service
    runs whenever the pipeline finds the assignment changed."""

    def __init__(
        self,
        settings: Settings,
        *,
        metrics: ServiceMetrics,
        decisions: DecisionProcess,
        pipeline: BatchPipeline,
        ownership: PartitionOwnership,
        stop: StopRequest,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._decisions = decisions
        self._pipeline = pipeline
        self._ownership = ownership
        self._stop = stop

    async def on_revoked(self, revoked: frozenset[TopicPartition]) -> None:
        # Waits for the batch in flight: its transaction ends before the partitions move. A failure is left
        # in the task for the pipeline to raise.
        async with self._pipeline.batch_lock:
            await self._pipeline.in_flight_ended()
            self._ownership.revoke()

    async def on_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        async with self._pipeline.batch_lock:
            self._ownership.assign(assigned)

    async def reconcile(self, consumer: BatchConsumer, producer: TransactionalProducer) -> None:
        """Check that this instance owns every input partition; roll the index back to Kafka's offsets. A
        rebalance meanwhile (the listener moves the ownership on) leaves the rest to the next reconciliation."""
        self._ownership.reconcile()
        assigned = consumer.assignment()
        everything = consumer.subscribed_partitions()
        self._metrics.record_assignment([(tp.topic, tp.partition) for tp in assigned])
        missing = everything - assigned
        if missing or not everything:
            if missing:
                log.error(
                    "ANOTHER INSTANCE IS IN CONSUMER GROUP %r: this one was assigned %d of %d input partitions "
                    "(missing %s). The index is local to one instance, so splitting the input would let "
                    "duplicates through; processing NOTHING until this instance owns every partition again. "
                    "Stop the other instance, or set kafka.sequence_topic on every instance to scale out.",
                    self._settings.kafka.group_id,
                    len(assigned),
                    len(everything),
                    ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(missing)),
                )
            else:
                log.warning("input topics %s have no partitions (yet)", self._settings.kafka.input_topics)
            consumer.pause(assigned)
            self._ownership.split(assigned)
            return
        consumer.resume(assigned)
        origins = self._pipeline.origins
        stored = {
            partition: origins.kafka_offset(offset)
            for partition, offset in (await self._decisions.source_offsets()).items()
        }
        committed, uncommitted = await self._committed(consumer, assigned, stored)
        # LMDB commits before Kafka, so the index is at or ahead of Kafka; behind means it lost data.
        behind = {
            tp: stored.get((tp.topic, tp.partition), 0)
            for tp, offset in committed.items()
            if stored.get((tp.topic, tp.partition), 0) < offset
        }
        if behind and not await self._replay(consumer, behind, committed):
            return  # the next reconciliation goes on from where the index got to
        removed = await self._decisions.rollback(
            {(tp.topic, tp.partition): origins.index_offset(offset) for tp, offset in committed.items()}
        )
        if uncommitted:
            # Without this, a batch decided into the index and never committed to Kafka (the instance died in
            # between) would look like the index's own progress at the next start, and never be published.
            await producer.publish([], {tp: committed[tp] for tp in uncommitted}, self._settings.kafka.group_id)
        if self._ownership.state is not Ownership.RECONCILING or consumer.assignment() != assigned:
            return  # rebalanced meanwhile: reconciled again for the new assignment
        consumer.seek(committed)
        self._ownership.own(assigned)
        log.info(
            "owning all %d input partitions; index reconciled with Kafka (%d entries rolled back)",
            len(assigned),
            removed,
            extra={"committed": {f"{tp.topic}[{tp.partition}]": o for tp, o in sorted(committed.items())}},
        )

    async def _committed(
        self, consumer: BatchConsumer, assigned: frozenset[TopicPartition], stored: Mapping[tuple[str, int], int]
    ) -> tuple[dict[TopicPartition, int], list[TopicPartition]]:
        """Where each partition resumes, and the partitions Kafka has no offset of. Kafka's committed offset;
        without one (a new group id, a group deleted or its offsets expired) the index's own offset, so that
        nothing it holds is rolled back and published again; the earliest offset for a partition neither
        knows."""
        committed = await consumer.committed(assigned)
        lost = sorted(tp for tp, offset in committed.items() if offset is None)
        known = {tp: stored[(tp.topic, tp.partition)] for tp in lost if (tp.topic, tp.partition) in stored}
        if known:
            log.warning(
                "Kafka has no committed offset of group %r for %s; resuming where the index is",
                self._settings.kafka.group_id,
                ", ".join(f"{tp.topic}[{tp.partition}] at {offset}" for tp, offset in sorted(known.items())),
            )
        unknown = [tp for tp in lost if tp not in known]
        earliest = await consumer.beginning_offsets(unknown) if unknown else {}
        resumed = {
            tp: offset if offset is not None else known.get(tp, earliest.get(tp, 0)) for tp, offset in committed.items()
        }
        return resumed, lost

    async def _replay(
        self, consumer: BatchConsumer, behind: Mapping[TopicPartition, int], committed: Mapping[TopicPartition, int]
    ) -> bool:
        """Decide again, without publishing, what Kafka says was processed but the index lacks (it was lost,
        replaced by an older copy, or is new), so that duplicates of those documents are still caught. Each
        replayed batch advances the index's source offsets in its own transaction, like any batch. False
        when a rebalance or a stop interrupted it."""
        assigned = consumer.assignment()
        log.warning(
            "the index is behind Kafka's committed offsets for %s (was it replaced or lost?); replaying those "
            "records into the index, publishing nothing",
            ", ".join(f"{tp.topic}[{tp.partition}]: {behind[tp]} < {committed[tp]}" for tp in sorted(behind)),
        )
        if self._pipeline.origins.sequenced:
            return await self._followed(consumer, behind, committed)
        ends = {tp: committed[tp] for tp in behind}
        consumer.pause(assigned - ends.keys())
        consumer.seek(behind)
        replayed = 0
        try:
            while ends:
                if (
                    self._stop.is_set()
                    or self._ownership.state is not Ownership.RECONCILING
                    or consumer.assignment() != assigned
                ):
                    return False
                records = [
                    record
                    for record in await consumer.batch()
                    if record.offset < ends.get(TopicPartition(record.topic, record.partition), -1)
                ]
                if records:
                    await self._pipeline.replay(records)
                    replayed += len(records)
                for tp in list(ends):
                    # The position, not the last record: transaction markers take offsets too.
                    if await consumer.position(tp) >= ends[tp]:
                        consumer.pause([tp])
                        del ends[tp]
        finally:
            consumer.resume(assigned)
        log.info("replayed %d records into the index", replayed)
        return True

    async def _followed(
        self, consumer: BatchConsumer, behind: Mapping[TopicPartition, int], committed: Mapping[TopicPartition, int]
    ) -> bool:
        """Scaled out: store what the decider's verdict records say the index lacks (:class:`.follower.Follower`),
        deciding only what none covers. False when a rebalance or a stop interrupted it."""
        assigned = consumer.assignment()
        ((tp, held),) = behind.items()
        async with Follower(self._settings, self._pipeline, self._stop, decide_uncovered=True) as follower:
            while held < committed[tp]:
                if (
                    self._stop.is_set()
                    or self._ownership.state is not Ownership.RECONCILING
                    or consumer.assignment() != assigned
                ):
                    return False
                held = await follower.level(held, committed[tp])
        log.info("the index is level with the decider's verdicts up to sequence offset %d", held)
        return True
