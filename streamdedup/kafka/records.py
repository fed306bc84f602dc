"""What the service publishes for each input record: the novel document, a duplicate, or a dead letter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka.structs import ConsumerRecord

from ..document import DeadLetter
from ..names import (
    HEADER_DEAD_LETTER_DETAIL,
    HEADER_DEAD_LETTER_REASON,
    HEADER_FINGERPRINT,
    HEADER_MATCH_DISTANCE,
    HEADER_MATCH_ID,
    HEADER_MATCH_REASON,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
)

__all__ = ["OutgoingRecord", "dead_letter", "duplicate", "novel"]

Headers = tuple[tuple[str, bytes], ...]

# A detail longer than this is cut (the original value travels whole in the record value).
_MAX_DETAIL_CHARS = 1000


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    topic: str
    value: bytes | None
    key: bytes | None
    headers: Headers


def novel(record: ConsumerRecord, topic: str, fingerprint: str) -> OutgoingRecord:
    """The original key, value and headers, plus the fingerprint (as ``fingerprint_hex`` writes it)."""
    return OutgoingRecord(
        topic,
        record.value,
        record.key,
        (*_headers(record), (HEADER_FINGERPRINT, fingerprint.encode())),
    )


def duplicate(
    record: ConsumerRecord, topic: str, fingerprint: str, reason: str, match_id: str, distance: int
) -> OutgoingRecord:
    """The original record plus what it duplicates (match id, Hamming distance, exact/near) and where it was."""
    return OutgoingRecord(
        topic,
        record.value,
        record.key,
        (
            *_headers(record),
            (HEADER_FINGERPRINT, fingerprint.encode()),
            (HEADER_MATCH_ID, match_id.encode()),
            (HEADER_MATCH_DISTANCE, str(distance).encode()),
            (HEADER_MATCH_REASON, reason.encode()),
            *_source(record),
        ),
    )


def dead_letter(record: ConsumerRecord, topic: str, letter: DeadLetter) -> OutgoingRecord:
    """The original bytes (value, key, headers) untouched, plus the reason, a detail and the source position."""
    return OutgoingRecord(
        topic,
        record.value,
        record.key,
        (
            *_headers(record),
            (HEADER_DEAD_LETTER_REASON, letter.reason.encode()),
            (HEADER_DEAD_LETTER_DETAIL, letter.detail[:_MAX_DETAIL_CHARS].encode("utf-8", "replace")),
            *_source(record),
        ),
    )


def _headers(record: ConsumerRecord) -> Sequence[tuple[str, bytes]]:
    return tuple(record.headers or ())


def _source(record: ConsumerRecord) -> Headers:
    return (
        (HEADER_SOURCE_TOPIC, record.topic.encode()),
        (HEADER_SOURCE_PARTITION, str(record.partition).encode()),
        (HEADER_SOURCE_OFFSET, str(record.offset).encode()),
    )
