"""What a fetched batch carries, where the index says each of its documents came from, and the offsets the index
keeps: one mapping for input read directly and for input read through the sequence topic.

Read directly, a record is its own input and its origin is where it was fetched (topic, partition, offset).
Read through the sequence topic, a fetched record carries a packed batch of input records: each gets the origin
(sequence topic, partition, offset << 20 | position), an origin of its own that still sorts by sequence offset,
and the index keeps sequence offsets shifted the same way. The index's rollback to an offset then undoes whole
sequence records, and a replay of one meets what its first run met.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from ..kafka.consumer import Unreadable
from ..kafka.sequence_records import SEQUENCE_POSITION_BITS, NotASequenceRecord, SignedRecords, unpacked
from ..signature import Signatures

__all__ = ["Carried", "Origin", "Origins"]

Origin = tuple[str, int, int]
"""(topic, partition, offset) in the index's offsets."""


@dataclass(frozen=True)
class Carried:
    """The input records of a fetched batch, each one's origin, and their signatures when every sequence
    record of the batch brought them."""

    records: list[ConsumerRecord]
    origins: list[Origin]
    signed: SignedRecords | None = None

    def signatures(self, rows: Sequence[int], signing: str) -> Signatures | None:
        """The signatures the sequencing instances made of these records' documents (``rows``), if they made them
        all as ``signing`` (:func:`~streamdedup.signature.signing_id`) says."""
        if self.signed is None or self.signed.signing != signing:
            return None
        return self.signed.of_rows(rows)


class Origins:
    """The mapping for input read directly (``sequenced`` False) or through the sequence topic."""

    def __init__(self, *, sequenced: bool) -> None:
        self.sequenced = sequenced
        self._shift = SEQUENCE_POSITION_BITS if sequenced else 0

    def carried(self, fetched: Sequence[ConsumerRecord]) -> Carried:
        """The input records ``fetched`` carries, in order, and each one's origin. A sequence record that cannot
        be unpacked stands for itself, as :class:`Unreadable` (dead-lettered, and the batch goes on)."""
        if not self.sequenced:
            return Carried(list(fetched), [(record.topic, record.partition, record.offset) for record in fetched])
        records: list[ConsumerRecord] = []
        origins: list[Origin] = []
        signed: list[SignedRecords | None] = []
        for record in fetched:
            try:
                batch = unpacked(record)
                carried, signed_rows = batch.records, batch.signed
            except NotASequenceRecord as exc:
                carried = [Unreadable.at(TopicPartition(record.topic, record.partition), record.offset, exc)]
                signed_rows = None
            first = record.offset << self._shift
            records += carried
            origins += [(record.topic, record.partition, first + position) for position in range(len(carried))]
            signed.append(signed_rows)
        return Carried(records, origins, SignedRecords.joined(signed))

    def index_offset(self, kafka_offset: int) -> int:
        """The index's offset for this offset of a fetched partition (the start of its sequence record)."""
        return kafka_offset << self._shift

    def kafka_offset(self, index_offset: int) -> int:
        """The offset of the fetched partition from which the index lacks records."""
        return index_offset >> self._shift
