"""A batch on its way through the service: fetched and prepared, decided, and the records it publishes.

Every input record gives one outgoing record, in input order: novel -> the output topic, duplicate -> the
duplicates topic (when there is one), anything that could not be decoded, signed, decided or published whole ->
the dead-letter topic.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from ..document import DeadLetter, Document, DocumentDecoder
from ..fingerprint import fingerprint_hex
from ..kafka.consumer import Unreadable
from ..kafka.records import (
    OutgoingRecord,
    dead_letter,
    decoded_records,
    default_id,
    duplicate,
    largest_record_bytes,
    novel,
    record_bytes,
    truncated_dead_letter,
)
from ..kafka.verdict_records import BatchVerdicts
from ..names import (
    DEAD_LETTER_DECIDE_CRASH,
    DEAD_LETTER_DECIDE_ERROR,
    DEAD_LETTER_OUTPUT_TOO_LARGE,
    DEAD_LETTER_SIGN_ERROR,
    DEAD_LETTER_UNREADABLE,
    NOT_DECIDED,
)
from ..settings import Settings
from ..signature import Signatures
from ..verdicts import Verdict, Verdicts
from .origins import Carried, Origin

__all__ = ["BatchOutput", "Decided", "Decision", "Prepared", "crashed"]

# What a duplicate adds to its input record beside the fingerprint (match id, distance, reason, source): an
# input record this much under its topic's limit fits there. Larger match ids are cut with the dead letter.
_OUTPUT_HEADER_ALLOWANCE = 4096
# The error of a document whose decision killed the decision process ("what: Class: message", as _failed reads).
_DECIDE_CRASH = "killed the decision process: DecisionProcessDied: it died deciding this document alone"


@dataclass(frozen=True)
class Prepared:
    """A fetched batch, decoded, its texts handed to the signing workers (``signing`` None: sign in-thread).
    ``records`` are the input records it carries, each with its ``origins`` (see :mod:`.origins`);
    ``fetched`` the records fetched, ``next_offsets`` the offsets after them; ``rows`` the positions in
    ``records`` of the ``documents``."""

    fetched: Sequence[ConsumerRecord]
    records: Sequence[ConsumerRecord]
    origins: list[Origin]
    decoded: list[Document | DeadLetter]
    rows: list[int]
    documents: list[Document]
    next_offsets: dict[TopicPartition, int]
    signing: Future[Signatures] | None
    started: float


class Decision(NamedTuple):
    """A batch's verdicts, and whether the call of the decision core that decided it began and ended with it: a
    decision process that falls behind decides the batches queued there together, in one call, and a replay that
    decides the same groups gives the same verdicts."""

    verdicts: Verdicts
    leads: bool = True
    closes: bool = True


@dataclass(frozen=True)
class Decided:
    """A decided batch waiting for its Kafka transaction."""

    fetched: Sequence[ConsumerRecord]
    records: Sequence[ConsumerRecord]
    next_offsets: dict[TopicPartition, int]
    outgoing: list[OutgoingRecord]
    dropped: list[tuple[Document, Verdict]]
    dead: list[DeadLetter]
    started: float
    verdict_record: OutgoingRecord | None = None
    """Scaled out, the batch's verdict record (:mod:`..kafka.verdict_records`)."""


class BatchOutput:
    """What a batch publishes, within the record size each output topic takes (``limits``, read at the start of
    each Kafka session; none known: no record is checked)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.limits: dict[str, int] = {}

    def decoded(self, decoder: DocumentDecoder, carried: Carried) -> tuple[list[Document | DeadLetter], list[int]]:
        """What the input records ``carried`` decode to, those whose output would not fit dead-lettered
        (:meth:`fitting`), and the rows of the documents among them: what a batch decides."""
        decoded = self.fitting(carried.records, decoded_records(decoder, carried.records, carried.origins))
        return decoded, [row for row, item in enumerate(decoded) if type(item) is Document]

    def fitting(
        self, records: Sequence[ConsumerRecord], decoded: list[Document | DeadLetter]
    ) -> list[Document | DeadLetter]:
        """``decoded`` with the documents whose output would not fit its topic dead-lettered, before the index
        could keep them."""
        if not self.limits:
            return decoded
        limit = self._smallest_output_limit()
        if largest_record_bytes(records) <= limit:
            return decoded
        result = list(decoded)
        for row, (record, item) in enumerate(zip(records, decoded, strict=True)):
            if type(item) is Document and (size := largest_record_bytes([record])) > limit:
                result[row] = DeadLetter(
                    DEAD_LETTER_OUTPUT_TOO_LARGE,
                    f"the record takes {size} bytes; its output would not fit the output topics "
                    f"(records up to about {limit} bytes fit)",
                    default_id(record),
                )
        return result

    def _smallest_output_limit(self) -> int:
        """The largest input record (:func:`record_bytes`) whose novel or duplicate record fits every topic
        it may go to."""
        kafka = self._settings.kafka
        topics = [kafka.output_topic] + ([] if kafka.duplicates_topic is None else [kafka.duplicates_topic])
        room = self._settings.fingerprint.width // 4 + _OUTPUT_HEADER_ALLOWANCE
        return min(self.limits[topic] for topic in topics) - room

    def decided(self, prepared: Prepared, decision: Decision) -> Decided:
        """What to publish for a decided batch; nothing goes to Kafka here."""
        records, verdicts = prepared.records, decision.verdicts
        outgoing, dropped, dead = self._outgoing(records, prepared.decoded, prepared.documents, verdicts)
        if self.limits and largest_record_bytes(outgoing) > min(self.limits.values()):
            outgoing = self._fitted(prepared, outgoing, dropped, dead)
        return Decided(
            prepared.fetched,
            records,
            prepared.next_offsets,
            outgoing,
            dropped,
            dead,
            prepared.started,
            self._verdict_record(prepared, decision),
        )

    def _verdict_record(self, prepared: Prepared, decision: Decision) -> OutgoingRecord | None:
        """Scaled out, which of the batch's input records the index stored, for the instances that follow."""
        topic = self._settings.kafka.verdicts_topic
        if topic is None:
            return None
        stored = np.zeros(len(prepared.records), dtype=bool)
        stored[prepared.rows] = decision.verdicts.stored
        (end,) = prepared.next_offsets.values()
        verdicts = BatchVerdicts(prepared.fetched[0].offset, end, decision.leads, decision.closes, stored)
        return OutgoingRecord(topic, verdicts.packed(), None, ())

    def _fitted(
        self,
        prepared: Prepared,
        outgoing: list[OutgoingRecord],
        dropped: list[tuple[Document, Verdict]],
        dead: list[DeadLetter],
    ) -> list[OutgoingRecord]:
        """``outgoing`` with every record larger than its topic takes replaced by its dead letter, cut to fit
        the dead-letter topic (one published whole would be refused by the broker, and retried for ever)."""
        kafka = self._settings.kafka
        limits = self.limits
        # The records that have an outgoing record, in order: all but duplicates without a duplicates topic.
        skipped = set() if kafka.duplicates_topic is not None else {doc.origin for doc, _ in dropped}
        sources = [
            record for record, origin in zip(prepared.records, prepared.origins, strict=True) if origin not in skipped
        ]
        letters = {letter.id: letter for letter in dead}
        fitted = []
        for out, record in zip(outgoing, sources, strict=True):
            size = record_bytes(out)
            if size <= limits.get(out.topic, size):
                fitted.append(out)
                continue
            record_id = default_id(record)
            letter = letters.get(record_id) if out.topic == kafka.dead_letter_topic else None
            if letter is None:
                letter = DeadLetter(
                    DEAD_LETTER_OUTPUT_TOO_LARGE,
                    f"its record for {out.topic} takes {size} bytes, over the {limits[out.topic]} that topic takes",
                    record_id,
                )
                dead.append(letter)
            letter_limit = limits[kafka.dead_letter_topic]
            fitted.append(truncated_dead_letter(record, kafka.dead_letter_topic, letter, letter_limit))
        return fitted

    def _outgoing(
        self,
        records: Sequence[ConsumerRecord],
        decoded: Sequence[Document | DeadLetter],
        documents: Sequence[Document],
        verdicts: Verdicts,
    ) -> tuple[list[OutgoingRecord], list[tuple[Document, Verdict]], list[DeadLetter]]:
        """Records to publish in input order: novel -> output, duplicate -> duplicates topic, bad -> DLQ."""
        kafka = self._settings.kafka
        hexes = fingerprint_hex(verdicts.fingerprints) if len(verdicts) else []
        # The documents are the decoded records that are not dead letters, in order: row counts them. Only
        # a duplicate's verdict is built as a tuple, from the columns.
        novel_rows = verdicts.novel.tolist()
        # Documents that could not be signed or decided: their rows' errors (rare: checked once a batch).
        errors = verdicts.errors if any(verdicts.errors) else None
        outgoing: list[OutgoingRecord] = []
        dropped: list[tuple[Document, Verdict]] = []
        dead: list[DeadLetter] = []
        row = -1
        for record, item in zip(records, decoded, strict=True):
            if not isinstance(item, Document):
                if isinstance(record, Unreadable) and record.error is not None:
                    item = DeadLetter.raised(
                        DEAD_LETTER_UNREADABLE,
                        f"the Kafka client cannot parse the record at {record.topic}[{record.partition}] offset "
                        f"{record.offset}; it was skipped",
                        record.error,
                        item.id,
                    )
                dead.append(item)
                outgoing.append(dead_letter(record, kafka.dead_letter_topic, item))
                continue
            row += 1
            error = None if errors is None else errors[row]
            if error is not None:
                letter = _failed(error, item.id, default_id(record))
                dead.append(letter)
                outgoing.append(dead_letter(record, kafka.dead_letter_topic, letter))
                continue
            if novel_rows[row]:
                outgoing.append(novel(record, kafka.output_topic, hexes[row]))
                continue
            verdict = verdicts[row]
            dropped.append((documents[row], verdict))
            if kafka.duplicates_topic is not None:
                outgoing.append(
                    duplicate(
                        record,
                        kafka.duplicates_topic,
                        hexes[row],
                        verdict.reason,
                        verdict.match_id or "",
                        verdict.distance if verdict.distance is not None else -1,
                        jaccard=verdict.jaccard,
                        threshold=self._settings.dedup.min_jaccard if self._settings.dedup.verify else None,
                    )
                )
        return outgoing, dropped, dead


def crashed(width: int) -> Verdicts:
    """The verdict of a document whose decision kills the decision process: not stored, dead-lettered."""
    fingerprint = np.zeros((1, width // 64), dtype=np.uint64)
    return Verdicts(np.ones(1, dtype=bool), ["unindexable"], fingerprint, [None], [None], [None], (_DECIDE_CRASH,))


def _failed(error: str, doc_id: str, record_id: str) -> DeadLetter:
    """The dead letter of a document whose verdict carries ``error``: the decision core's "not decided: Class:
    message", the signer's "could not ... this text: Class: message", or a crash of the decision process."""
    if error == _DECIDE_CRASH:
        reason = DEAD_LETTER_DECIDE_CRASH
    else:
        reason = DEAD_LETTER_DECIDE_ERROR if error.startswith(f"{NOT_DECIDED}:") else DEAD_LETTER_SIGN_ERROR
    parts = error.split(": ", 2)
    name = parts[1] if len(parts) == 3 and parts[1].isidentifier() else None
    return DeadLetter(reason, f"document {doc_id!r}: {error}", record_id, name)
