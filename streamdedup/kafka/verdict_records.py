"""Verdict records: which input records of one of the decider's batches its index stored.

Scaled out, the decider publishes one verdict record with each batch, in the batch's Kafka transaction, to the
verdicts topic (the sequence topic's name and ``.verdicts``, one partition). An instance that brings its index
level with the decider's (the warm standby, a decider whose index is behind, an index rebuilt from Kafka) stores
the documents these records name, in the same batches, instead of deciding the sequence topic again: its index
then holds exactly what the decider's held, even where a candidate bound made the decider's verdicts depend on
how its batches were cut; the batches of one of the decider's calls are stored as that call stored them. A record
is msgpack: the format, the batch's first sequence offset, the offset after it, whether a call of the decider's
decision core began with it and whether that call ended with it (the batches from one that began a call to one
that ended it were decided together), and a bit per input record its sequence records carry, in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import numpy as np

__all__ = ["VERDICTS_FORMAT", "BatchVerdicts", "NotAVerdictRecord"]

VERDICTS_FORMAT = 2
"""The packing's version, first in every verdict record: a reader refuses one it does not know."""


class NotAVerdictRecord(ValueError):
    """A record of the verdicts topic that this version cannot unpack."""


@dataclass(frozen=True, eq=False)
class BatchVerdicts:
    """The sequence records from offset ``first`` up to ``end`` (the offset the decider committed after them)
    were decided as one batch, in a call of the decision core that began with it (``leads``) or with a batch
    before it, and that ended with it (``closes``) or goes on with the next; ``stored`` says, per input record
    they carry in order, whether the index stored its document."""

    first: int
    end: int
    leads: bool
    closes: bool
    stored: np.ndarray

    def continues(self, previous: BatchVerdicts) -> bool:
        """Whether this batch was decided in the same call as ``previous``, the batch before it."""
        return not previous.closes and not self.leads

    def packed(self) -> bytes:
        stored = np.asarray(self.stored, dtype=bool)
        return msgpack.packb(
            [
                VERDICTS_FORMAT,
                self.first,
                self.end,
                self.leads,
                self.closes,
                len(stored),
                np.packbits(stored).tobytes(),
            ],
            use_bin_type=True,
        )

    @classmethod
    def unpacked(cls, value: bytes | None) -> BatchVerdicts:
        """Raises :class:`NotAVerdictRecord`."""
        try:
            fields = msgpack.unpackb(value or b"", use_list=True, raw=False)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise NotAVerdictRecord(f"not a verdict record: {type(exc).__name__}: {exc}") from exc
        if not isinstance(fields, list) or not fields:
            raise NotAVerdictRecord(f"not a verdict record: {type(fields).__name__}")
        if fields[0] != VERDICTS_FORMAT:
            raise NotAVerdictRecord(f"a verdict record of format {fields[0]!r}; this version reads {VERDICTS_FORMAT}")
        if len(fields) != 7:
            raise NotAVerdictRecord(f"not a verdict record: {len(fields)} fields")
        _, first, end, leads, closes, count, bits = fields
        if not (
            isinstance(first, int)
            and isinstance(end, int)
            and isinstance(leads, bool)
            and isinstance(closes, bool)
            and isinstance(count, int)
            and isinstance(bits, bytes)
            and 0 <= first < end
            and 0 <= count <= 8 * len(bits) < count + 8
        ):
            raise NotAVerdictRecord(f"not a verdict record: offsets {first!r}..{end!r}, {count!r} records")
        stored = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), count=count).astype(bool)
        return cls(first, end, leads, closes, stored)
