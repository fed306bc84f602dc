"""Structured logging: one line per record, readable text or JSON, with the record's ``extra`` fields.

``configure_logging(settings)`` installs one handler on the root logger. A line the Kafka client repeats (a
broker that is down: several a second) shows once a while, with how many like it were not shown. Every secret
of the settings (each ``SecretStr``/``SecretBytes`` value) is masked in the final line, whatever put it there:
a message, an argument, an extra field or a traceback, spelled as itself or escaped in a repr or a JSON string.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from pydantic import BaseModel, SecretBytes, SecretStr

from .settings import Settings

__all__ = [
    "LIBRARY_LOGGERS",
    "JsonFormatter",
    "LibraryRepeats",
    "Quiet",
    "TextFormatter",
    "configure_logging",
    "secret_values",
]

MASK = "**********"

# The libraries whose INFO lines a report keeps out (see configure_logging's ``quiet``).
LIBRARY_LOGGERS = ("aiokafka", "kafka")
Quiet = Literal["", "libraries", "all"]

# Attributes every LogRecord has; anything else on a record came from ``extra=`` and is logged as a field.
_STANDARD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class _Redacting(logging.Formatter):
    def __init__(self, secrets: Iterable[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        spellings = {spelling for secret in secrets if secret for spelling in _spellings(secret)}
        # Longest first, so a secret containing another is masked whole.
        self._secrets = sorted(spellings, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        line = self.render(record)
        for secret in self._secrets:
            line = line.replace(secret, MASK)
        return line

    def render(self, record: logging.LogRecord) -> str:
        raise NotImplementedError


class TextFormatter(_Redacting):
    """``2026-01-01T00:00:00.000Z INFO streamdedup.service: message key=value ...``"""

    def render(self, record: logging.LogRecord) -> str:
        fields = "".join(
            f" {key}={value!r}" if isinstance(value, str) else f" {key}={value}" for key, value in _extras(record)
        )
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}{fields}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(_Redacting):
    """One JSON object per line: time, level, logger, message, the extra fields, and exception if any."""

    def render(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_extras(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


# Lines LibraryRepeats holds before it drops those with nothing left to report.
_MOST_LINES_HELD = 1024


class LibraryRepeats(logging.Filter):
    """Lets a library's line through once per ``interval`` seconds: of the records of one logger of
    :data:`LIBRARY_LOGGERS` with one level and the same text, the first passes and those within ``interval``
    after it are counted, not shown. The next one to pass carries that count as ``repeats_not_shown``. Lines that
    differ (another node, group or error) are not repeats; other loggers' records all pass."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval = interval
        self._clock = clock
        # (logger, level, text) -> (when one last passed, how many since were not shown)
        self._shown: dict[tuple[str, int, str], tuple[float, int]] = {}
        self._forget_at = _MOST_LINES_HELD

    def filter(self, record: logging.LogRecord) -> bool:
        if self._interval <= 0 or not _from_library(record.name):
            return True
        key = (record.name, record.levelno, record.getMessage())
        now = self._clock()
        shown_at, not_shown = self._shown.get(key, (None, 0))
        if shown_at is not None and now - shown_at < self._interval:
            self._shown[key] = (shown_at, not_shown + 1)
            return False
        if not_shown:
            record.repeats_not_shown = not_shown
        self._shown[key] = (now, 0)
        if len(self._shown) > self._forget_at:
            self._forget_settled(now)
        return True

    def _forget_settled(self, now: float) -> None:
        """Drop lines whose interval has passed with no repeat: they hold nothing to report (a long run, or DEBUG
        lines that each differ, would otherwise fill the map)."""
        self._shown = {
            key: (shown_at, not_shown)
            for key, (shown_at, not_shown) in self._shown.items()
            if not_shown or now - shown_at < self._interval
        }
        # Lines still within their interval stay: the next pass waits until as many again have come.
        self._forget_at = max(_MOST_LINES_HELD, 2 * len(self._shown))


def _from_library(name: str) -> bool:
    return any(name == library or name.startswith(library + ".") for library in LIBRARY_LOGGERS)


def configure_logging(settings: Settings, stream: TextIO | None = None, *, quiet: Quiet = "") -> logging.Handler:
    """Route every log record to ``stream`` (standard error) at ``settings.logging.level``; return the handler.

    ``quiet`` keeps the INFO lines out of a command whose output is its own report: "libraries" those of
    :data:`LIBRARY_LOGGERS` (aiokafka logs every group join and coordinator it finds), "all" everyone's. Warnings
    and errors still show, and a DEBUG level in the settings asks for every line."""
    formatter_class = JsonFormatter if settings.logging.format == "json" else TextFormatter
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter_class(secret_values(settings)))
    handler.addFilter(LibraryRepeats(settings.logging.library_repeat_seconds))
    level = logging.getLevelNamesMapping()[settings.logging.level]
    logging.basicConfig(level=level, handlers=[handler], force=True)
    floor = max(level, logging.WARNING) if quiet and level > logging.DEBUG else logging.NOTSET
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(floor)
    if quiet == "all" and floor:
        logging.getLogger().setLevel(floor)
    return handler


def secret_values(model: BaseModel) -> list[str]:
    """The plain values of every SecretStr/SecretBytes field anywhere in ``model``."""
    return list(_walk_secrets(model))


def _walk_secrets(value: object) -> Iterator[str]:
    if isinstance(value, SecretStr):
        yield value.get_secret_value()
    elif isinstance(value, SecretBytes):
        yield value.get_secret_value().decode("utf-8", "replace")
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _walk_secrets(getattr(value, name))
    elif isinstance(value, dict):
        for item in value.values():
            yield from _walk_secrets(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _walk_secrets(item)


def _spellings(secret: str) -> set[str]:
    """How a secret can appear in a line: as itself, escaped in a str or bytes repr (aiokafka logs the bytes of
    a SASL PLAIN request at DEBUG), and each of those escaped again in a JSON string."""
    forms = {secret, repr(secret)[1:-1], repr(secret.encode("utf-8", "surrogatepass"))[2:-1]}
    return forms | {json.dumps(form, ensure_ascii=False)[1:-1] for form in forms}


def _extras(record: logging.LogRecord) -> list[tuple[str, Any]]:
    return [(key, value) for key, value in vars(record).items() if key not in _STANDARD_ATTRIBUTES]


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
