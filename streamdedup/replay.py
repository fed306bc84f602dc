"""`streamdedup replay`: a scaled-out deployment's decisions made again from Kafka, and compared.

The sequence topic fixes the order of a scaled-out deployment's decisions, and the verdicts topic records, for each
of the decider's batches, which of its input records the index stored and which batches one call of the decision
core decided together (:mod:`.kafka.verdict_records`). A replay reads both from their beginning, outside any
consumer group, and decides the same documents in the same calls into an empty index of its own: it publishes and
commits nothing. With the deployment's settings it stores what the decider stored; with other settings (a change
under consideration) it names the documents they would decide otherwise.

Sequence records that no verdict record covers (decided by a version that published none, or whose verdict record
cannot be read) are decided as well, one call per run of them, and counted apart: nothing records how they were
decided, so they are not compared.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from .decide import Deduplicator, open_index
from .document import Document, DocumentDecoder
from .kafka.admin import admin_client
from .kafka.clients import common_options
from .kafka.consumer import standalone_consumer
from .kafka.records import topic_record_limits
from .kafka.verdict_records import BatchVerdicts, NotAVerdictRecord
from .service.batch import BatchOutput
from .service.origins import Origins
from .settings import ConfigError, Settings
from .signature import Signatures, signing_id

__all__ = ["ReplayReport", "replay"]

log = logging.getLogger(__name__)

SHOWN = 20
"""Ids of differing documents a report lists, of each kind."""


@dataclass
class ReplayReport:
    """What a replay decided, against what the decider stored."""

    calls: int = 0
    batches: int = 0
    records: int = 0
    stored_then: int = 0
    stored_now: int = 0
    uncovered: int = 0
    """Input records of sequence records that no verdict record covers: decided, not compared."""
    only_then: list[str] = field(default_factory=list)
    """Ids of the documents the decider stored and the replay did not (a near copy now, or dead-lettered)."""
    only_now: list[str] = field(default_factory=list)
    """Ids of the documents the replay stored and the decider did not."""

    @property
    def differ(self) -> int:
        return len(self.only_then) + len(self.only_now)

    def as_dict(self, shown: int = SHOWN) -> dict[str, object]:
        return {
            "calls": self.calls,
            "batches": self.batches,
            "input_records": self.records,
            "stored_by_the_decider": self.stored_then,
            "stored_by_the_replay": self.stored_now,
            "not_covered_by_verdict_records": self.uncovered,
            "differ": self.differ,
            "stored_by_the_decider_only": self.only_then[:shown],
            "stored_by_the_replay_only": self.only_now[:shown],
        }


async def replay(settings: Settings, work_dir: Path) -> ReplayReport:
    """Decide the sequence topic again in the decider's calls, into a new index in ``work_dir``, and compare what
    it stores with the verdict records. Raises :class:`ConfigError` without ``kafka.sequence_topic``."""
    kafka = settings.kafka
    if kafka.sequence_topic is None or kafka.verdicts_topic is None:
        raise ConfigError("kafka.sequence_topic: only a scaled-out deployment records its order to replay")
    sequence, verdicts_tp = TopicPartition(kafka.sequence_topic, 0), TopicPartition(kafka.verdicts_topic, 0)
    outputs = [kafka.output_topic] + ([] if kafka.duplicates_topic is None else [kafka.duplicates_topic])
    async with admin_client(**common_options(kafka)) as admin:
        limits = await topic_record_limits(admin, outputs, kafka.max_request_bytes)
    consumers = {tp: standalone_consumer(kafka, settings.input.max_message_bytes) for tp in (sequence, verdicts_tp)}
    try:
        for tp, consumer in consumers.items():
            await consumer.start()
            consumer.assign([tp])
        start = (await consumers[sequence].beginning_offsets([sequence]))[sequence]
        recorded = _verdicts(await _read(consumers[verdicts_tp], None))
        report = ReplayReport()
        with open_index(settings, work_dir) as index:
            deciding = _Calls(settings, Deduplicator(settings, index), limits)
            for call in _calls(recorded, start):
                fetched = await _read(consumers[sequence], (call[0].first, call[-1].end))
                deciding.decide(call, fetched, report)
        return report
    finally:
        for consumer in consumers.values():
            await consumer.stop()


class _Calls:
    """Calls of the decision core over sequence records, as the decider made them."""

    def __init__(self, settings: Settings, dedup: Deduplicator, limits: dict[str, int]) -> None:
        self._dedup = dedup
        self._topic = cast(str, settings.kafka.sequence_topic)
        self._signing = signing_id(settings.fingerprint, settings.dedup)
        self._decoder = DocumentDecoder(settings.input)
        self._origins = Origins(sequenced=True)
        # Documents whose output would not fit the output topics are dead-lettered before a decision, as there.
        self._output = BatchOutput(settings)
        self._output.limits = limits

    def decide(self, call: list[BatchVerdicts], fetched: Sequence[ConsumerRecord], report: ReplayReport) -> None:
        if not fetched:
            return  # offsets of transaction markers alone, between two batches
        documents: list[Document] = []
        signed: list[Signatures | None] = []
        parts: list[tuple[int, dict[tuple[str, int], int]]] = []
        batches: list[tuple[BatchVerdicts, list[str], list[int]]] = []
        for batch in call:
            carried = self._origins.carried([record for record in fetched if batch.first <= record.offset < batch.end])
            decoded, rows = self._output.decoded(self._decoder, carried)
            documents += [cast(Document, decoded[row]) for row in rows]
            signed.append(carried.signatures(rows, self._signing))
            parts.append((len(documents), {(self._topic, 0): self._origins.index_offset(batch.end)}))
            batches.append((batch, [item.id for item in decoded], rows))
        joined = None if any(each is None for each in signed) else Signatures.joined(cast(list[Signatures], signed))
        stored = self._dedup.decide(documents, signatures=joined, part_offsets=parts).stored
        report.calls += 1
        at = 0
        for batch, ids, rows in batches:
            now = np.zeros(len(ids), dtype=bool)
            now[rows] = stored[at : at + len(rows)]
            at += len(rows)
            report.records += len(ids)
            report.stored_now += int(now.sum())
            if batch.stored is _UNCOVERED or len(batch.stored) != len(ids):
                report.uncovered += len(ids)
                continue
            report.batches += 1
            report.stored_then += int(batch.stored.sum())
            report.only_then += [ids[row] for row in np.flatnonzero(batch.stored & ~now).tolist()]
            report.only_now += [ids[row] for row in np.flatnonzero(now & ~batch.stored).tolist()]


_UNCOVERED = np.zeros(0, dtype=bool)
"""The stored bits of a run of sequence records that no verdict record covers."""


def _verdicts(records: Sequence[ConsumerRecord]) -> list[BatchVerdicts]:
    """The readable verdict records; what one that cannot be read covered is decided as no verdict record's."""
    verdicts = []
    for record in records:
        try:
            verdicts.append(BatchVerdicts.unpacked(record.value))
        except NotAVerdictRecord as exc:
            log.error("skipping the record at %s offset %d: %s", record.topic, record.offset, exc)
    return verdicts


def _calls(recorded: list[BatchVerdicts], start: int) -> Iterator[list[BatchVerdicts]]:
    """The decider's calls, from sequence offset ``start`` on: each from a batch that began one to the batch that
    ended it, or to before the next that began one (its decider died mid-call); a run of sequence records no
    verdict record covers is a call of its own."""
    call: list[BatchVerdicts] = []
    held = start
    for batch in recorded:
        if batch.end <= held:
            continue
        if batch.first > held:
            if call:
                yield call
            call = []
            yield [BatchVerdicts(held, batch.first, True, True, _UNCOVERED)]
        elif batch.first < held:
            # The replay's index holds the batch's first records already: only the rest is new, and not compared.
            batch = BatchVerdicts(held, batch.end, batch.leads, batch.closes, _UNCOVERED)
        if call and not batch.continues(call[-1]):
            yield call
            call = []
        call.append(batch)
        held = batch.end
    if call:
        yield call


async def _read(consumer: AIOKafkaConsumer, span: tuple[int, int] | None) -> list[ConsumerRecord]:
    """The readable records of the consumer's one partition from offset ``span[0]`` up to ``span[1]``; without a
    span, from the beginning up to the end offset it has now."""
    (tp,) = consumer.assignment()
    if span is None:
        start = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
    else:
        start, end = span
    if await consumer.position(tp) != start:
        consumer.seek(tp, start)
    records: list[ConsumerRecord] = []
    while await consumer.position(tp) < end:
        fetched = await consumer.getmany(tp, timeout_ms=1000)
        records += [record for record in fetched.get(tp, []) if record.offset < end]
    return records
