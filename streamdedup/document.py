"""Raw record bytes -> Document, or DeadLetter naming why not. Shared by the Kafka service and the offline mode.

No Kafka here: the caller passes the value bytes, a default id (the service uses topic-partition-offset) and a
default event time (the service uses the record timestamp).

No record raises: whatever fails for one value (a number too long for Python, a time past any float) makes a
dead letter naming the error's class. Event times more than ``max_future_seconds`` ahead of the wall clock
are clamped to that bound, so a burst of bad stamps cannot move the index's expiry clock.
"""

from __future__ import annotations

import json
import math
import time as wallclock
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import repeat
from typing import Any, NamedTuple

import orjson

from .names import (
    DEAD_LETTER_DECODE_ERROR,
    DEAD_LETTER_EMPTY_TEXT,
    DEAD_LETTER_INVALID_JSON,
    DEAD_LETTER_MISSING_FIELD,
    DEAD_LETTER_NOT_UTF8,
    DEAD_LETTER_NULL_VALUE,
    DEAD_LETTER_TOO_LARGE,
)
from .settings import InputSettings

__all__ = ["DeadLetter", "Document", "DocumentDecoder"]

_MISSING = object()
_NUMBER = (int, float)


class Document(NamedTuple):
    """One document to deduplicate. ``time`` is its event time (epoch seconds); ``origin`` its source
    (topic, partition, offset) when it came from Kafka. A named tuple: immutable, and several times cheaper
    to build than a frozen dataclass, which counts at one per record."""

    id: str
    text: str
    time: float
    origin: tuple[str, int, int] | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that cannot become a Document: ``reason`` is one of names.DEAD_LETTER_REASONS, ``detail`` a
    readable explanation for that record alone, ``id`` the id it would have had by default, ``error`` the class
    of the exception it raised (None when it was refused without one)."""

    reason: str
    detail: str
    id: str
    error: str | None = None

    @classmethod
    def raised(cls, reason: str, what: str, error: BaseException, default_id: str) -> DeadLetter:
        """The dead letter of a record whose processing raised ``error``."""
        name = type(error).__name__
        return cls(reason, f"{what}: {name}: {error}", default_id, name)


class DocumentDecoder:
    """Decodes record values per :class:`InputSettings` (JSON with field paths, or raw UTF-8 text)."""

    def __init__(self, settings: InputSettings) -> None:
        self.settings = settings
        self._text_paths = [_split_path(path) for path in settings.text_fields]
        self._id_path = _split_path(settings.id_field) if settings.id_field else None
        self._time_path = _split_path(settings.time_field) if settings.time_field else None
        # Read once here: this runs per record.
        self._json = settings.format == "json"
        self._max_bytes = settings.max_message_bytes
        self._max_future = settings.max_future_seconds
        self.clamped_times = 0
        """Event times clamped to ``max_future_seconds`` ahead of the wall clock, since this decoder was made."""
        # The batch path reads top-level fields only, and leaves event times to the record path.
        self._top_level = (
            self._json
            and self._time_path is None
            and all(len(path) == 1 for path in self._text_paths)
            and (self._id_path is None or len(self._id_path) == 1)
        )

    def decode_many(
        self,
        values: Sequence[bytes | None],
        *,
        default_ids: Sequence[str],
        timestamps: Sequence[float],
        origins: Sequence[tuple[str, int, int] | None] | None = None,
    ) -> list[Document | DeadLetter]:
        """What :meth:`decode` gives each value, in order. A batch of JSON objects whose fields are all
        top-level strings is read column by column, without a Python call per record; any other batch (one
        record outside that is enough) is read record by record."""
        origins = [None] * len(values) if origins is None else origins
        if not len(values) == len(default_ids) == len(timestamps) == len(origins):
            raise ValueError("values, default_ids, timestamps and origins must be of one length")
        latest = wallclock.time() + self._max_future
        if self._time_path is None and timestamps and max(timestamps) > latest:
            timestamps = self._clamped(timestamps, latest)
        try:
            documents = self._documents(values, default_ids, timestamps, origins) if self._top_level else None
        except Exception:
            documents = None  # the record path finds the value that made it raise, and dead-letters it alone
        if documents is not None:
            return documents
        return [
            self._decode(value, default_id, timestamp, origin, latest)
            for value, default_id, timestamp, origin in zip(values, default_ids, timestamps, origins, strict=True)
        ]

    def _clamped(self, timestamps: Sequence[float], latest: float) -> list[float]:
        self.clamped_times += sum(stamp > latest for stamp in timestamps)
        return [min(stamp, latest) for stamp in timestamps]

    def _documents(
        self,
        values: Sequence[bytes | None],
        default_ids: Sequence[str],
        timestamps: Sequence[float],
        origins: Sequence[tuple[str, int, int] | None],
    ) -> list[Document | DeadLetter] | None:
        """Every value as a Document, or None as soon as one would not be (or would need the record path)."""
        if None in values or (values and max(map(len, values)) > self._max_bytes):  # type: ignore[arg-type]
            return None
        try:
            records = [orjson.loads(value) for value in values]  # type: ignore[arg-type]
        except orjson.JSONDecodeError:
            return None
        if not all(type(record) is dict for record in records):
            return None
        columns = []
        for (name,) in self._text_paths:
            column = [record.get(name) for record in records]
            if not all(type(text) is str for text in column):
                return None
            columns.append(column)
        join = self.settings.text_separator.join
        texts = columns[0] if len(columns) == 1 else list(map(join, zip(*columns, strict=True)))
        # str.strip() leaves nothing exactly when the text is empty or all whitespace.
        if "" in texts or any(map(str.isspace, texts)):
            return None
        ids = default_ids
        if self._id_path is not None:
            (name,) = self._id_path
            ids = [record.get(name) for record in records]
            if not all(type(found) is str for found in ids) or "" in ids or not _unicode("".join(ids)):
                return None
        # tuple.__new__ is what Document._make calls, here without a Python-level call per record.
        rows = zip(ids, texts, timestamps, origins, strict=True)
        return list(map(tuple.__new__, repeat(Document), rows))

    def decode(
        self, value: bytes | None, *, default_id: str, timestamp: float, origin: tuple[str, int, int] | None = None
    ) -> Document | DeadLetter:
        """A Document (with this ``origin``), or a DeadLetter for this value alone; never raises for bad input."""
        latest = wallclock.time() + self._max_future
        if self._time_path is None and timestamp > latest:
            (timestamp,) = self._clamped([timestamp], latest)
        return self._decode(value, default_id, timestamp, origin, latest)

    def _decode(
        self, value: bytes | None, default_id: str, timestamp: float, origin: tuple[str, int, int] | None, latest: float
    ) -> Document | DeadLetter:
        try:
            return self._read(value, default_id, timestamp, origin, latest)
        except Exception as exc:
            return DeadLetter.raised(DEAD_LETTER_DECODE_ERROR, "could not read the record", exc, default_id)

    def _read(
        self, value: bytes | None, default_id: str, timestamp: float, origin: tuple[str, int, int] | None, latest: float
    ) -> Document | DeadLetter:
        if value is None:
            return DeadLetter(DEAD_LETTER_NULL_VALUE, "the record has no value (null / tombstone)", default_id)
        if len(value) > self._max_bytes:
            return DeadLetter(
                DEAD_LETTER_TOO_LARGE,
                f"value is {len(value)} bytes, over max_message_bytes={self._max_bytes}",
                default_id,
            )
        if self._json:
            record = _fast_json(value)
            if record is not None:
                fast = self._from_json(record, default_id, timestamp, origin, latest, floats_exact=False)
                if fast is not None:
                    return fast
        try:
            decoded = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            return DeadLetter(DEAD_LETTER_NOT_UTF8, f"value is not UTF-8: {exc.reason} at byte {exc.start}", default_id)
        if not self._json:
            return self._document(default_id, decoded, timestamp, default_id, origin)
        try:
            record = json.loads(decoded)
        except json.JSONDecodeError as exc:
            return DeadLetter(DEAD_LETTER_INVALID_JSON, f"invalid JSON: {exc}", default_id)
        except RecursionError:
            return DeadLetter(DEAD_LETTER_INVALID_JSON, "invalid JSON: nested too deeply", default_id)
        if not isinstance(record, dict):
            return DeadLetter(
                DEAD_LETTER_INVALID_JSON, f"expected a JSON object, got {type(record).__name__}", default_id
            )
        document = self._from_json(record, default_id, timestamp, origin, latest)
        assert document is not None
        return document

    def _from_json(
        self,
        record: dict[str, Any],
        default_id: str,
        timestamp: float,
        origin: tuple[str, int, int] | None,
        latest: float,
        *,
        floats_exact: bool = True,
    ) -> Document | DeadLetter | None:
        """The record's Document or DeadLetter. Without ``floats_exact`` (orjson read the record, and it reads
        integers past 64 bits as floats), None when a text or the id is a float: the standard library reads
        that record again, so that an id stays exactly as written."""
        parts = []
        for path, name in zip(self._text_paths, self.settings.text_fields, strict=False):
            value = _lookup(record, path)
            if not floats_exact and type(value) is float:
                return None
            text = _scalar_text(value)
            if text is None:
                return DeadLetter(DEAD_LETTER_MISSING_FIELD, f"no text at field {name!r}", default_id)
            parts.append(text)
        doc_id = default_id
        if self._id_path is not None:
            value = _lookup(record, self._id_path)
            if not floats_exact and type(value) is float:
                return None
            found = _scalar_text(value)
            if not found:
                return DeadLetter(DEAD_LETTER_MISSING_FIELD, f"no id at field {self.settings.id_field!r}", default_id)
            if not _unicode(found):
                # JSON's \ud800-style escapes can spell a lone surrogate, which no UTF-8 (nor the index) can hold.
                return DeadLetter(
                    DEAD_LETTER_NOT_UTF8,
                    f"the id at field {self.settings.id_field!r} holds a lone surrogate: {ascii(found)[:200]}",
                    default_id,
                )
            doc_id = found
        if self._time_path is not None:
            time = _event_time(_lookup(record, self._time_path))
            if time is None:
                return DeadLetter(
                    DEAD_LETTER_MISSING_FIELD,
                    f"no event time (epoch seconds or ISO 8601) at field {self.settings.time_field!r}",
                    default_id,
                )
            if time > latest:
                self.clamped_times += 1
                time = latest
            timestamp = time
        text = parts[0] if len(parts) == 1 else self.settings.text_separator.join(parts)
        return self._document(doc_id, text, timestamp, default_id, origin)

    @staticmethod
    def _document(
        doc_id: str, text: str, time: float, default_id: str, origin: tuple[str, int, int] | None
    ) -> Document | DeadLetter:
        if not text.strip():
            return DeadLetter(DEAD_LETTER_EMPTY_TEXT, "the text is empty or only whitespace", default_id)
        return Document(doc_id, text, time, origin)


def _fast_json(value: bytes) -> dict[str, Any] | None:
    """The JSON object in ``value`` read by orjson (several times faster than the standard library), or None:
    then the standard library reads it, as it reads what orjson refuses (lone surrogate escapes, NaN) and
    explains what neither reads."""
    try:
        record = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def _unicode(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form (no lone surrogates); ASCII, the common case, without encoding it."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _split_path(path: str) -> list[str]:
    return path.split(".")


def _lookup(record: Any, path: list[str]) -> Any:
    """Follow a dotted path through objects (by key) and arrays (by integer index)."""
    if len(path) == 1 and type(record) is dict:
        # The common case, a top-level field: one lookup.
        return record.get(path[0], _MISSING)
    node = record
    for part in path:
        if isinstance(node, dict):
            node = node.get(part, _MISSING)
        elif isinstance(node, list) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
        if node is _MISSING:
            return _MISSING
    return node


def _scalar_text(value: Any) -> str | None:
    """Strings as they are, numbers as written; null, objects, arrays and booleans are not text."""
    if type(value) is str:
        return value
    if isinstance(value, _NUMBER) and not isinstance(value, bool):
        return str(value)
    return None


def _event_time(value: Any) -> float | None:
    if isinstance(value, _NUMBER) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.timestamp()
    return None
