"""Sequence records: input records of one partition packed into one record of the one-partition sequence topic.

The sequence topic's offsets are the one order in which a scaled-out deployment decides. A whole batch of input
records travels as one sequence record, so the deciding instance pays Kafka's cost per record once a batch. The
packing is msgpack: columns of the records' coordinates, timestamps, keys, values and headers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgpack
from aiokafka.structs import ConsumerRecord

from .consumer import Unreadable

__all__ = ["SEQUENCE_FORMAT", "SEQUENCE_POSITION_BITS", "NotASequenceRecord", "UnparsedRecord", "packed", "unpacked"]

SEQUENCE_FORMAT = 1
"""The packing's version, first in every sequence record: a reader refuses one it does not know."""
SEQUENCE_POSITION_BITS = 20
"""A sequence record carries fewer than ``2 ** SEQUENCE_POSITION_BITS`` records (their positions in it are what
the decider's origins keep below the sequence offset)."""

# What a packed record adds to its records' keys, values and headers (msgpack framing, offset, timestamp, an
# error name), at most; and what a sequence record adds to its records.
_RECORD_OVERHEAD_BYTES = 64
_PACK_OVERHEAD_BYTES = 1024


class NotASequenceRecord(ValueError):
    """A record of the sequence topic that this version cannot unpack."""


class UnparsedRecord(Exception):
    """What the sequencing instance's Kafka client raised parsing an input record (its class and message)."""


def packed(records: Sequence[ConsumerRecord], limit: int) -> list[bytes]:
    """Records of one partition, in offset order, as sequence record values of at most ``limit`` bytes each.
    A record alone takes at most ``limit`` less 64 KiB (the settings make the input's largest so)."""
    values: list[bytes] = []
    start, size = 0, 0
    for end, record in enumerate(records):
        cost = _record_bytes(record)
        full = end - start == 1 << SEQUENCE_POSITION_BITS
        if end > start and (full or size + cost > limit - _PACK_OVERHEAD_BYTES):
            values.append(_pack(records[start:end]))
            start, size = end, 0
        size += cost
    if start < len(records):
        values.append(_pack(records[start:]))
    return values


def unpacked(record: ConsumerRecord) -> list[ConsumerRecord]:
    """The input records a sequence record carries, in their order. A record whose client could not parse it
    comes back as :class:`Unreadable` with an :class:`UnparsedRecord` error. Raises :class:`NotASequenceRecord`."""
    try:
        fields = msgpack.unpackb(record.value, use_list=True, raw=False)
        version, topic, partition, offsets, timestamps, keys, values, headers, errors = fields
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise NotASequenceRecord(f"not a sequence record: {type(exc).__name__}: {exc}") from exc
    if version != SEQUENCE_FORMAT:
        raise NotASequenceRecord(f"a sequence record of format {version!r}; this version reads {SEQUENCE_FORMAT}")
    return [
        ConsumerRecord(
            topic,
            partition,
            offset,
            timestamp,
            0,
            key,
            value,
            None,
            -1 if key is None else len(key),
            -1 if value is None else len(value),
            [(name, content) for name, content in header],
        )
        if error is None
        else Unreadable(topic, partition, offset, timestamp, 0, None, None, None, -1, -1, (), UnparsedRecord(error))
        for offset, timestamp, key, value, header, error in zip(
            offsets, timestamps, keys, values, headers, errors, strict=True
        )
    ]


def _pack(records: Sequence[ConsumerRecord]) -> bytes:
    first = records[0]
    fields: list[Any] = [
        SEQUENCE_FORMAT,
        first.topic,
        first.partition,
        [record.offset for record in records],
        [record.timestamp for record in records],
        [record.key for record in records],
        [record.value for record in records],
        [list(record.headers or ()) for record in records],
        list(_errors(records)),
    ]
    return msgpack.packb(fields, use_bin_type=True)


def _errors(records: Iterable[ConsumerRecord]) -> Iterable[str | None]:
    for record in records:
        error = record.error if isinstance(record, Unreadable) else None
        yield None if error is None else f"{type(error).__name__}: {error}"


def _record_bytes(record: ConsumerRecord) -> int:
    headers = sum(len(name) + len(content) for name, content in record.headers or ())
    return len(record.key or b"") + len(record.value or b"") + headers + _RECORD_OVERHEAD_BYTES
