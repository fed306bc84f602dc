"""The warm standby: while another instance decides the sequence topic, one other keeps its index level with it.

Instances that do not decide join the standby group (the decider group's name plus ``.standby``), which Kafka
gives the sequence partition to one of them: that one follows. The decider's committed offset on the sequence
topic says how far its decisions are final; the standby stores, batch by batch, what the decider's verdict
records say its index stored up to there (:class:`.follower.Follower`), publishing nothing. Its index is then
the decider's, and when Kafka hands it the decider's partition it has little or nothing to replay
(``Reconciler``) before it decides. Following reads the sequence topic again, so there is one standby, not one
per instance; with ``kafka.warm_standby`` off there is none, and a new decider replays what its index lacks.
"""

from __future__ import annotations

import logging

from aiokafka import AIOKafkaConsumer, TopicPartition

from ..decision_process import DecisionProcess
from ..kafka.clients import common_options
from ..kafka.consumer import BatchConsumer
from ..kafka.decider_assignor import DeciderClaim
from ..lifecycle import StopRequest
from ..metrics import ServiceMetrics
from ..settings import Settings
from .batch_pipeline import BatchPipeline
from .follower import Follower

__all__ = ["Standby"]

log = logging.getLogger(__name__)

# How often a standby that is level with the decider looks again.
_LEVEL_POLL_SECONDS = 0.5


class Standby:
    """Follows the sequence topic into the index until this instance is given the sequence partition."""

    def __init__(
        self,
        settings: Settings,
        *,
        metrics: ServiceMetrics,
        decisions: DecisionProcess,
        pipeline: BatchPipeline,
        claim: DeciderClaim,
        stop: StopRequest,
    ) -> None:
        topic = settings.kafka.sequence_topic
        if topic is None:
            raise ValueError("a standby needs kafka.sequence_topic")
        self._settings = settings
        self._metrics = metrics
        self._decisions = decisions
        self._pipeline = pipeline
        self._claim = claim
        self._stop = stop
        self._partition = TopicPartition(topic, 0)
        # Whether the index has been level with the decider since this instance began to follow it.
        self._caught_up = False

    async def until_assigned(self, consumer: BatchConsumer) -> bool:
        """Stand by until ``consumer`` (in the decider group) holds the sequence partition (True), or a stop
        (False), following the decider while the standby group gives this instance the partition. Both
        consumers keep polling meanwhile, so that their groups keep this member."""
        kafka = self._settings.kafka
        if consumer.assignment():
            return not self._stop.is_set()
        log.info("standing by: another instance decides the sequence topic %s", self._partition.topic)
        if not kafka.warm_standby:
            while not consumer.assignment() and not self._stop.is_set():
                await consumer.batch()
            return not self._stop.is_set()
        group = AIOKafkaConsumer(
            # A dynamic member: leaving the group (to decide, or to stop) hands the standby's part over at once.
            group_id=f"{kafka.group_id}.standby",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=kafka.session_timeout_ms,
            heartbeat_interval_ms=kafka.heartbeat_interval_ms,
            **common_options(kafka),
        )
        await group.start()
        follower: Follower | None = None
        try:
            group.subscribe([self._partition.topic])
            while not consumer.assignment():
                if self._stop.is_set():
                    return False
                if (follower is not None) != bool(group.assignment()):
                    follower = await self._followed_by(follower)
                # The group only says who follows: its consumer reads nothing, and is polled to stay in it.
                group.pause(*group.assignment())
                await group.getmany(timeout_ms=0)
                if not (follower is not None and await self._followed(consumer, follower)):
                    await self._stop.sleep(_LEVEL_POLL_SECONDS)
                await consumer.batch(wait=False)
        finally:
            if follower is not None:
                await follower.stop()
            await group.stop()
            self._metrics.record_roles(following=False)
        return not self._stop.is_set()

    async def _followed_by(self, follower: Follower | None) -> Follower | None:
        """A follower when there is none (the standby group gave this instance the sequence partition), else
        none (it moved away)."""
        log.info("%s the decider", "following" if follower is None else "no longer following")
        self._metrics.record_standby_lag(0)
        self._metrics.record_roles(following=follower is None)
        if follower is not None:
            await follower.stop()
            return None
        follower = Follower(self._settings, self._pipeline, self._stop, decide_uncovered=False)
        await follower.start()
        self._caught_up = False
        return follower

    async def claim_progress(self) -> int:
        """How far the index has got on the sequence topic, which is what this instance claims when it joins
        the decider group (:mod:`..kafka.decider_assignor`)."""
        tp = self._partition
        stored = (await self._decisions.source_offsets()).get((tp.topic, tp.partition), 0)
        self._claim.progress = self._pipeline.origins.kafka_offset(stored)
        return self._claim.progress

    async def _followed(self, consumer: BatchConsumer, follower: Follower) -> bool:
        """Store the next batch the decider has committed and the index lacks; False when level, or when its
        verdicts are not readable yet."""
        tp = self._partition
        decided = (await consumer.committed([tp]))[tp] or 0
        held = await self.claim_progress()
        self._metrics.record_standby_lag(max(0, decided - held))
        if held >= decided:
            if not self._caught_up:
                log.info("level with the decider at sequence offset %d", held)
                self._caught_up = True
            return False
        return await follower.level(held, decided) > held
