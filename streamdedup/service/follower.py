"""The follower: brings this instance's index level with the decider's by the decider's verdict records.

The warm standby, and a decider whose index is behind the decider group's committed offset (it was lost, or
another instance decided meanwhile), read the verdicts topic (:mod:`..kafka.verdict_records`) and, for each of
the decider's batches, the sequence records the batch was; they store the documents the decider's index stored,
each of its calls in one transaction with a part per batch as that call stored them (``BatchPipeline.store``),
and decide nothing. The index then holds exactly what the decider's held, down to the rows its tables keep of
removed entries until their sweeps, even where a candidate bound made the decider's verdicts depend on how its
batches were cut, and following costs a fraction of deciding. Sequence records that no verdict record covers
(decided by a version that published none, or whose verdict record is damaged) are decided again instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from ..kafka.consumer import standalone_consumer
from ..kafka.verdict_records import BatchVerdicts, NotAVerdictRecord
from ..lifecycle import Lifecycle, StopRequest
from ..settings import Settings
from .batch_pipeline import BatchPipeline

__all__ = ["Follower", "first_call", "unbroken"]

log = logging.getLogger(__name__)


class Follower(Lifecycle):
    """Reads the verdicts topic and the sequence topic, each through a consumer of its own outside any group;
    ``level`` stores the next of the decider's batches that the index lacks. ``start()``/``stop()`` (idempotent),
    or ``async with``.

    ``decide_uncovered``: sequence records below the decider's committed offset that no readable verdict record
    covers are decided (a decider, which fenced every earlier one, so that every verdict record is readable), or
    waited for (the standby: the commit of the decider's last transaction may show on its offset a moment
    before on its verdict record)."""

    def __init__(
        self, settings: Settings, pipeline: BatchPipeline, stop: StopRequest, *, decide_uncovered: bool
    ) -> None:
        kafka = settings.kafka
        if kafka.sequence_topic is None or kafka.verdicts_topic is None:
            raise ValueError("a follower needs kafka.sequence_topic")
        self._settings = settings
        self._pipeline = pipeline
        self._stop = stop
        self._decide_uncovered = decide_uncovered
        self._sequence = TopicPartition(kafka.sequence_topic, 0)
        self._verdicts = TopicPartition(kafka.verdicts_topic, 0)
        self._consumers: dict[TopicPartition, AIOKafkaConsumer] = {}
        # The verdict records read and not yet stored, and whether the verdicts consumer was placed for them.
        self._pending: list[BatchVerdicts] = []
        self._placed = False
        # Sequence records fetched ahead: every record from ``_ahead_from`` up to the consumer's position.
        self._ahead: list[ConsumerRecord] = []
        self._ahead_from = -1

    async def start(self) -> None:
        if self._consumers:
            return
        for tp in (self._sequence, self._verdicts):
            consumer = standalone_consumer(self._settings.kafka, self._settings.input.max_message_bytes)
            self._consumers[tp] = consumer
            await consumer.start()
            consumer.assign([tp])

    async def stop(self) -> None:
        consumers, self._consumers = self._consumers, {}
        for consumer in consumers.values():
            await consumer.stop()

    async def level(self, held: int, until: int) -> int:
        """Store the next of the decider's calls after sequence offset ``held`` (the index holds what comes before
        it) and below ``until`` (the decider's committed offset), or decide what no verdict record covers there; the
        offset the index holds up to after that, ``held`` when there was nothing to do yet. A call is stored whole,
        as the decider's index stored it, once its last batch's verdict record is readable (the decider commits a
        call's batches one after the other); an instance that decides, having fenced every earlier decider, takes
        what the last of them committed of its last call as the whole call."""
        verdicts = await self._next_verdicts(held)
        if verdicts is None or verdicts.first >= until:
            if not self._decide_uncovered:
                return held
            return until if await self._decided(held, until) else held
        if verdicts.first > held and not await self._decided(held, verdicts.first):
            return held
        call = await self._call()
        if call is None:
            return held
        fetched = await self._sequence_records(call[0].first, call[-1].end)
        if self._stop.is_set():
            return held
        call = unbroken(call, [record.offset for record in fetched])
        await self._pipeline.store(call, [record for record in fetched if record.offset < call[-1].end], held)
        del self._pending[: len(call)]
        return call[-1].end

    async def _decided(self, start: int, end: int) -> bool:
        """Decide the sequence records from ``start`` up to ``end`` that no verdict record covers; False on a stop
        (nothing decided)."""
        fetched = await self._sequence_records(start, end)
        if self._stop.is_set():
            return False
        if fetched:
            log.warning("no verdict record covers sequence offsets %d..%d: deciding them again", start, end - 1)
            await self._pipeline.replay(fetched)
        return True

    async def _next_verdicts(self, held: int) -> BatchVerdicts | None:
        """The first readable verdict record of a batch that ends after ``held``."""
        if not self._placed:
            await self._place(held)
        while True:
            while self._pending and self._pending[0].end <= held:
                self._pending.pop(0)
            if self._pending:
                return self._pending[0]
            if not await self._read_verdicts():
                return None

    async def _call(self) -> list[BatchVerdicts] | None:
        """The verdict records of the decider's call that the first pending one is of (:func:`first_call`), None
        while the rest of it may still come."""
        while (call := first_call(self._pending, complete=False)) is None:
            if not await self._read_verdicts():
                # A deciding instance fenced the call's decider: what that one committed of it is all there is.
                return first_call(self._pending, complete=self._decide_uncovered)
        return call

    async def _read_verdicts(self) -> bool:
        """Read the next verdict records into the pending ones; False when none is readable yet."""
        consumer = self._consumers[self._verdicts]
        while True:
            fetched = await consumer.getmany(self._verdicts, timeout_ms=self._settings.kafka.batch_timeout_ms)
            records = fetched.get(self._verdicts, [])
            if not records:
                # An empty fetch may only be a slow one: none is readable once the position is at the end.
                end = (await consumer.end_offsets([self._verdicts]))[self._verdicts]
                if await consumer.position(self._verdicts) >= end:
                    return False
                continue
            pending = len(self._pending)
            for record in records:
                try:
                    self._pending.append(BatchVerdicts.unpacked(record.value))
                except NotAVerdictRecord as exc:
                    log.error("skipping the record at %s offset %d: %s", self._verdicts, record.offset, exc)
            if len(self._pending) > pending:
                return True

    async def _place(self, held: int) -> None:
        """Seek the verdicts consumer to the first record of a batch ending after ``held``, or a little before:
        a bisection over the topic's offsets, a fetch a step (the records follow the sequence topic's order)."""
        consumer = self._consumers[self._verdicts]
        low = (await consumer.beginning_offsets([self._verdicts]))[self._verdicts]
        high = (await consumer.end_offsets([self._verdicts]))[self._verdicts]
        while low < high:
            middle = (low + high) // 2
            first = await self._first_at(middle, high)
            if first is None:
                high = middle
            elif _ends_after(first, held):
                high = first.offset
            else:
                low = first.offset + 1
        consumer.seek(self._verdicts, low)
        self._pending.clear()
        self._placed = True

    async def _first_at(self, offset: int, below: int) -> ConsumerRecord | None:
        """The first readable record of the verdicts topic from ``offset`` on, if it is below ``below``."""
        consumer = self._consumers[self._verdicts]
        consumer.seek(self._verdicts, offset)
        while await consumer.position(self._verdicts) < below:
            fetched = await consumer.getmany(self._verdicts, timeout_ms=self._settings.kafka.batch_timeout_ms)
            records = fetched.get(self._verdicts, [])
            if records:
                return records[0] if records[0].offset < below else None
        return None

    async def _sequence_records(self, start: int, end: int) -> list[ConsumerRecord]:
        """The sequence topic's readable records from offset ``start`` up to ``end`` (fewer on a stop)."""
        consumer = self._consumers[self._sequence]
        position = await consumer.position(self._sequence) if self._ahead_from >= 0 else -1
        if not self._ahead_from <= start <= position:
            consumer.seek(self._sequence, start)
            self._ahead, self._ahead_from, position = [], start, start
        while position < end and not self._stop.is_set():
            fetched = await consumer.getmany(self._sequence, timeout_ms=self._settings.kafka.batch_timeout_ms)
            self._ahead += fetched.get(self._sequence, [])
            position = await consumer.position(self._sequence)
        records = [record for record in self._ahead if start <= record.offset < end]
        self._ahead = [record for record in self._ahead if record.offset >= end]
        self._ahead_from = max(self._ahead_from, min(end, position))
        return records


def first_call(pending: Sequence[BatchVerdicts], *, complete: bool) -> list[BatchVerdicts] | None:
    """Of these verdict records in order, those of the decider's call that the first is of: from it to the one
    that ends the call, or to before one that begins another (the call's decider died mid-call, and another went
    on). None when no record ends the call yet, unless ``complete``."""
    call = [pending[0]]
    for following in pending[1:]:
        if not following.continues(call[-1]):
            return call
        call.append(following)
    return call if call[-1].closes or complete else None


def unbroken(call: list[BatchVerdicts], offsets: Sequence[int]) -> list[BatchVerdicts]:
    """The call's batches up to before the first that follows sequence records (at ``offsets``, ascending) that
    no batch of the call covers: a verdict record between them was unreadable, and they are decided apart."""
    at = np.asarray(offsets, dtype=np.int64)
    for count in range(1, len(call)):
        low, high = np.searchsorted(at, [call[count - 1].end, call[count].first])
        if high > low:
            return call[:count]
    return call


def _ends_after(record: ConsumerRecord, held: int) -> bool:
    """Whether the verdicts topic's ``record`` is of a batch that ends after sequence offset ``held`` (a record
    that is none counts as ending before: it is skipped)."""
    try:
        return BatchVerdicts.unpacked(record.value).end > held
    except NotAVerdictRecord:
        return False
