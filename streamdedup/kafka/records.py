"""What the service publishes for each input record: the novel document, a duplicate, or a dead letter; and
how large a record each topic takes (a dead letter too large for its topic is cut to fit)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import NamedTuple

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import ConsumerRecord

from ..document import DeadLetter, Document, DocumentDecoder
from ..names import (
    HEADER_DEAD_LETTER_DETAIL,
    HEADER_DEAD_LETTER_ERROR,
    HEADER_DEAD_LETTER_REASON,
    HEADER_DEAD_LETTER_TRUNCATED,
    HEADER_FINGERPRINT,
    HEADER_MATCH_DISTANCE,
    HEADER_MATCH_ID,
    HEADER_MATCH_JACCARD,
    HEADER_MATCH_REASON,
    HEADER_MATCH_THRESHOLD,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
)

__all__ = [
    "BROKER_DEFAULT_MAX_MESSAGE_BYTES",
    "OutgoingRecord",
    "dead_letter",
    "decoded_records",
    "default_id",
    "duplicate",
    "largest_record_bytes",
    "novel",
    "record_bytes",
    "topic_record_limits",
    "truncated_dead_letter",
]

Headers = tuple[tuple[str, bytes], ...]

# A detail longer than this is cut (the original value travels whole in the record value).
_MAX_DETAIL_CHARS = 1000
# Kafka's default message.max.bytes: what a topic takes when its own limit cannot be read.
BROKER_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
_MAX_MESSAGE_BYTES = "max.message.bytes"


class OutgoingRecord(NamedTuple):
    """A record to publish. A named tuple: one is built per record, several times cheaper than a frozen
    dataclass."""

    topic: str
    value: bytes | None
    key: bytes | None
    headers: Headers


def default_id(record: ConsumerRecord) -> str:
    """A document's id when its record's value names none: where the record is."""
    return f"{record.topic}-{record.partition}-{record.offset}"


def decoded_records(
    decoder: DocumentDecoder,
    records: Sequence[ConsumerRecord],
    origins: Sequence[tuple[str, int, int] | None] | None = None,
) -> list[Document | DeadLetter]:
    """What ``decoder`` makes of each record's value, its id defaulting to :func:`default_id` and its time to the
    record's timestamp."""
    return decoder.decode_many(
        [record.value for record in records],
        default_ids=[default_id(record) for record in records],
        timestamps=[record.timestamp / 1000.0 for record in records],
        origins=origins,
    )


def novel(record: ConsumerRecord, topic: str, fingerprint: str) -> OutgoingRecord:
    """The original key, value and headers, plus the fingerprint (as ``fingerprint_hex`` writes it)."""
    return OutgoingRecord(
        topic,
        record.value,
        record.key,
        (*_headers(record), (HEADER_FINGERPRINT, fingerprint.encode())),
    )


def duplicate(
    record: ConsumerRecord,
    topic: str,
    fingerprint: str,
    reason: str,
    match_id: str,
    distance: int,
    *,
    jaccard: float | None,
    threshold: float | None,
) -> OutgoingRecord:
    """The original record plus what it duplicates (match id, Hamming distance, exact/near/redelivered), the
    estimated Jaccard of the two texts and the threshold it was held to (each header left out when None), and
    where it was."""
    measured = () if jaccard is None else ((HEADER_MATCH_JACCARD, f"{jaccard:.3f}".encode()),)
    # The threshold as configured (repr), not rounded: 0.55 reads as 0.55.
    held_to = () if threshold is None else ((HEADER_MATCH_THRESHOLD, repr(float(threshold)).encode()),)
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
            *measured,
            *held_to,
            *_source(record),
        ),
    )


def dead_letter(record: ConsumerRecord, topic: str, letter: DeadLetter) -> OutgoingRecord:
    """The original bytes (value, key, headers) untouched, plus the reason, a detail, the error's class (for a
    record that raised) and the source position."""
    return OutgoingRecord(topic, record.value, record.key, (*_headers(record), *_letter(record, letter)))


def truncated_dead_letter(record: ConsumerRecord, topic: str, letter: DeadLetter, limit: int) -> OutgoingRecord:
    """The dead letter of ``record`` cut to at most ``limit`` bytes (see :func:`record_bytes`): the head of its
    value, with its key and headers when they fit beside the dead letter's own, and a header giving the size of
    the record it replaces. The source headers say where the original is."""
    whole = dead_letter(record, topic, letter)
    own = (*_letter(record, letter), (HEADER_DEAD_LETTER_TRUNCATED, str(record_bytes(whole)).encode()))
    value = record.value or b""
    for key, headers in ((record.key, (*_headers(record), *own)), (None, own)):
        # The empty value's length takes one byte where the cut value's takes up to five.
        room = limit - record_bytes(OutgoingRecord(topic, b"", key, headers)) - 4
        if room >= 0:
            return OutgoingRecord(topic, value[:room], key, headers)
    return OutgoingRecord(topic, None, None, own)


def record_bytes(record: OutgoingRecord) -> int:
    """At most how many bytes ``record`` takes alone in a record batch, which is what a topic's
    ``max.message.bytes`` limits (uncompressed: the producer does not compress)."""
    size: int = DefaultRecordBatchBuilder.estimate_size_in_bytes(record.key, record.value, list(record.headers))
    return size


def largest_record_bytes(records: Sequence[OutgoingRecord] | Sequence[ConsumerRecord]) -> int:
    """The largest :func:`record_bytes` of ``records`` (0 for none), without a Python call per record."""
    if not records:
        return 0
    keys, values, headers = (
        map(attrgetter("key"), records),
        map(attrgetter("value"), records),
        map(attrgetter("headers"), records),
    )
    largest: int = max(map(DefaultRecordBatchBuilder.estimate_size_in_bytes, keys, values, map(list, headers)))
    return largest


async def topic_record_limits(
    admin: AIOKafkaAdminClient, topics: Iterable[str], max_request_bytes: int
) -> dict[str, int]:
    """The largest record batch each topic takes: its ``max.message.bytes``, at most ``max_request_bytes`` (the
    producer refuses more). A topic whose configuration cannot be read gets Kafka's default."""
    topics = list(topics)
    limits = dict.fromkeys(topics, BROKER_DEFAULT_MAX_MESSAGE_BYTES)
    resources = [ConfigResource(ConfigResourceType.TOPIC, topic, {_MAX_MESSAGE_BYTES: None}) for topic in topics]
    for response in await admin.describe_configs(resources):
        for error_code, _, _, topic, entries in response.resources:
            for name, value, *_ in entries if error_code == 0 else ():
                if name == _MAX_MESSAGE_BYTES and value is not None:
                    limits[topic] = int(value)
    return {topic: min(limit, max_request_bytes) for topic, limit in limits.items()}


def _headers(record: ConsumerRecord) -> Sequence[tuple[str, bytes]]:
    return tuple(record.headers or ())


def _letter(record: ConsumerRecord, letter: DeadLetter) -> Headers:
    error = () if letter.error is None else ((HEADER_DEAD_LETTER_ERROR, letter.error.encode()),)
    return (
        (HEADER_DEAD_LETTER_REASON, letter.reason.encode()),
        (HEADER_DEAD_LETTER_DETAIL, letter.detail[:_MAX_DETAIL_CHARS].encode("utf-8", "replace")),
        *error,
        *_source(record),
    )


def _source(record: ConsumerRecord) -> Headers:
    return (
        (HEADER_SOURCE_TOPIC, record.topic.encode()),
        (HEADER_SOURCE_PARTITION, str(record.partition).encode()),
        (HEADER_SOURCE_OFFSET, str(record.offset).encode()),
    )
