"""Sequence records: input records of one partition packed into one record of the one-partition sequence topic.

The sequence topic's offsets are the one order in which a scaled-out deployment decides. A whole batch of input
records travels as one sequence record, so the deciding instance pays Kafka's cost per record once a batch. The
packing is msgpack: columns of the records' coordinates, timestamps, keys, values and headers, and the
signatures the sequencing instance made of the documents they hold (:class:`SignedRecords`), so that neither the
decider nor its standbys sign them again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
from aiokafka.structs import ConsumerRecord

from ..minhash import SKETCH_DTYPE
from ..signature import Signatures
from .consumer import Unreadable

__all__ = [
    "SEQUENCE_FORMAT",
    "SEQUENCE_POSITION_BITS",
    "NotASequenceRecord",
    "SequencedBatch",
    "SignedRecords",
    "UnparsedRecord",
    "packed",
    "unpacked",
]

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


@dataclass(frozen=True)
class SignedRecords:
    """Signatures of a batch's records, a row each: ``signed`` marks the records that decoded into a document
    and were signed under ``signing`` (:func:`~streamdedup.signature.signing_id`); the other rows are empty."""

    signing: str
    signed: np.ndarray
    signatures: Signatures

    @classmethod
    def of(cls, signing: str, count: int, rows: Sequence[int], signatures: Signatures) -> SignedRecords:
        """The rows of ``count`` records whose records ``rows`` have ``signatures``, in that order."""
        signed = np.zeros(count, dtype=bool)
        signed[list(rows)] = True
        fingerprints = np.zeros((count, signatures.fingerprints.shape[1]), dtype=np.uint64)
        sketches = np.zeros((count, signatures.sketches.shape[1]), dtype=SKETCH_DTYPE)
        empty = np.zeros(count, dtype=bool)
        fingerprints[signed], sketches[signed], empty[signed] = (
            signatures.fingerprints,
            signatures.sketches,
            signatures.empty,
        )
        errors: list[str | None] = [None] * count
        # Texts that could not be signed are rare: a batch without any is placed without a loop.
        if any(signatures.errors):
            for row, error in zip(rows, signatures.errors, strict=True):
                errors[row] = error
        return cls(signing, signed, Signatures(fingerprints, sketches, tuple(errors), empty))

    def __len__(self) -> int:
        return len(self.signed)

    def rows(self, start: int, stop: int) -> SignedRecords:
        return SignedRecords(self.signing, self.signed[start:stop], self.signatures.subset(slice(start, stop)))

    def of_rows(self, rows: Sequence[int]) -> Signatures | None:
        """The signatures of these records (their documents), None unless every one was signed."""
        at = np.asarray(rows, dtype=np.intp)
        if not self.signed[at].all():
            return None
        signatures = self.signatures
        errors = signatures.errors
        picked = tuple(errors[row] for row in rows) if any(errors) else (None,) * len(rows)
        return Signatures(signatures.fingerprints[at], signatures.sketches[at], picked, signatures.empty[at])

    @classmethod
    def joined(cls, parts: Sequence[SignedRecords | None]) -> SignedRecords | None:
        """The rows of consecutive batches as one's; None unless every part has rows signed alike."""
        known = [part for part in parts if part is not None]
        if not known or len(known) < len(parts) or any(part.signing != known[0].signing for part in known):
            return None
        return cls(
            known[0].signing,
            np.concatenate([part.signed for part in known]),
            Signatures.joined([part.signatures for part in known]),
        )


@dataclass(frozen=True)
class SequencedBatch:
    """What a sequence record carries: input records, and their signatures when the sequencer signed them."""

    records: list[ConsumerRecord]
    signed: SignedRecords | None


def packed(records: Sequence[ConsumerRecord], limit: int, signed: SignedRecords | None = None) -> list[bytes]:
    """Records of one partition, in offset order (with their ``signed`` rows), as sequence record values of at
    most ``limit`` bytes each. A record alone takes at most ``limit`` less 64 KiB (the settings make the input's
    largest so)."""
    row_bytes = 0 if signed is None else _row_bytes(signed)
    values: list[bytes] = []
    start, size = 0, 0
    for end, record in enumerate(records):
        cost = _record_bytes(record) + row_bytes
        full = end - start == 1 << SEQUENCE_POSITION_BITS
        if end > start and (full or size + cost > limit - _PACK_OVERHEAD_BYTES):
            values.append(_pack(records[start:end], None if signed is None else signed.rows(start, end)))
            start, size = end, 0
        size += cost
    if start < len(records):
        values.append(_pack(records[start:], None if signed is None else signed.rows(start, len(records))))
    return values


def unpacked(record: ConsumerRecord) -> SequencedBatch:
    """The input records a sequence record carries, in their order, and their signatures if it has them. A
    record whose client could not parse it comes back as :class:`Unreadable` with an :class:`UnparsedRecord`
    error. Raises :class:`NotASequenceRecord`."""
    try:
        fields = msgpack.unpackb(record.value, use_list=True, raw=False)
        version, topic, partition, offsets, timestamps, keys, values, headers, errors, signing = fields
        signed = None if signing is None else _signed_rows(len(offsets), *signing)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise NotASequenceRecord(f"not a sequence record: {type(exc).__name__}: {exc}") from exc
    if version != SEQUENCE_FORMAT:
        raise NotASequenceRecord(f"a sequence record of format {version!r}; this version reads {SEQUENCE_FORMAT}")
    carried = [
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
    return SequencedBatch(carried, signed)


def _pack(records: Sequence[ConsumerRecord], signed: SignedRecords | None) -> bytes:
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
        None if signed is None else _signing_fields(signed),
    ]
    return msgpack.packb(fields, use_bin_type=True)


def _signing_fields(signed: SignedRecords) -> list[Any]:
    signatures = signed.signatures
    return [
        signed.signing,
        np.packbits(signed.signed).tobytes(),
        signatures.fingerprints.shape[1],
        np.ascontiguousarray(signatures.fingerprints, dtype="<u8").tobytes(),
        signatures.sketches.shape[1],
        np.ascontiguousarray(signatures.sketches, dtype="<u4").tobytes(),
        list(signatures.errors),
        np.packbits(signatures.empty).tobytes(),
    ]


def _signed_rows(
    count: int,
    signing: str,
    signed: bytes,
    words: int,
    fingerprints: bytes,
    k: int,
    sketches: bytes,
    errors: list[str | None],
    empty: bytes,
) -> SignedRecords:
    def bits(packed_bits: bytes) -> np.ndarray:
        return np.unpackbits(np.frombuffer(packed_bits, dtype=np.uint8), count=count).astype(bool)

    return SignedRecords(
        signing,
        bits(signed),
        Signatures(
            np.frombuffer(fingerprints, dtype="<u8").astype(np.uint64).reshape(count, words),
            np.frombuffer(sketches, dtype="<u4").astype(SKETCH_DTYPE).reshape(count, k),
            tuple(errors),
            bits(empty),
        ),
    )


def _row_bytes(signed: SignedRecords) -> int:
    signatures = signed.signatures
    return 8 * signatures.fingerprints.shape[1] + 4 * signatures.sketches.shape[1] + 2


def _errors(records: Iterable[ConsumerRecord]) -> Iterable[str | None]:
    for record in records:
        error = record.error if isinstance(record, Unreadable) else None
        yield None if error is None else f"{type(error).__name__}: {error}"


def _record_bytes(record: ConsumerRecord) -> int:
    headers = sum(len(name) + len(content) for name, content in record.headers or ())
    return len(record.key or b"") + len(record.value or b"") + headers + _RECORD_OVERHEAD_BYTES
