"""Logs: level and format from the settings, extra fields kept, secrets never printed, a library's repeated lines
shown once a while."""

from __future__ import annotations

import io
import json
import logging
import sys

from pydantic import SecretStr

from streamdedup.logs import (
    MASK,
    JsonFormatter,
    LibraryRepeats,
    Quiet,
    TextFormatter,
    configure_logging,
    secret_values,
)
from streamdedup.settings import Section, Settings


def record(message: str, *args: object, level: int = logging.INFO, **extra: object) -> logging.LogRecord:
    entry = logging.LogRecord("streamdedup.service", level, __file__, 1, message, args, None)
    entry.__dict__.update(extra)
    return entry


def test_json_line_carries_message_and_extra_fields() -> None:
    line = JsonFormatter().format(record("batch done in %.2f s", 0.25, partition=3, topic="in"))
    entry = json.loads(line)
    assert entry["message"] == "batch done in 0.25 s"
    assert (entry["level"], entry["logger"], entry["partition"], entry["topic"]) == (
        "INFO",
        "streamdedup.service",
        3,
        "in",
    )
    assert entry["time"].endswith("Z")
    assert "\n" not in line


def test_text_line_is_readable_with_fields() -> None:
    line = TextFormatter().format(record("rebalanced", assigned=2, topic="in"))
    assert line.split(" ", 1)[1] == "INFO streamdedup.service: rebalanced assigned=2 topic='in'"


def test_exception_is_kept_in_json() -> None:
    try:
        raise ValueError("bad batch")
    except ValueError:
        entry = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), exc_info=sys.exc_info())
    parsed = json.loads(JsonFormatter().format(entry))
    assert "ValueError: bad batch" in parsed["exception"]


class _Credentials(Section):
    password: SecretStr
    plain: str = "not-a-secret"


def test_every_secret_of_the_settings_is_masked_wherever_it_appears() -> None:
    creds = _Credentials(password=SecretStr("hunter2-longer"))
    secrets = secret_values(creds)
    assert secrets == ["hunter2-longer"]
    for formatter in (JsonFormatter(secrets), TextFormatter(secrets)):
        line = formatter.format(record("connecting with %s", "hunter2-longer", sasl="user:hunter2-longer"))
        assert "hunter2" not in line
        assert line.count(MASK) == 2


def test_configure_logging_sets_level_and_format() -> None:
    stream = io.StringIO()
    configure_logging(Settings(logging={"level": "warning", "format": "json"}), stream)
    logging.getLogger("streamdedup.test").info("hidden")
    logging.getLogger("streamdedup.test").warning("shown", extra={"lag": 12})
    lines = stream.getvalue().splitlines()
    assert [json.loads(line)["message"] for line in lines] == ["shown"]
    assert json.loads(lines[0])["lag"] == 12


def _logged(settings: Settings, quiet: Quiet) -> list[str]:
    stream = io.StringIO()
    configure_logging(settings, stream, quiet=quiet)
    logging.getLogger("aiokafka.consumer.group_coordinator").info("Joined group")
    logging.getLogger("aiokafka.conn").warning("connection lost")
    logging.getLogger("streamdedup.service").info("owning all 1 input partitions")
    logging.getLogger("streamdedup.service").warning("dead-lettered 3 records")
    return [line.split(": ", 1)[1] for line in stream.getvalue().splitlines()]


def test_a_report_keeps_the_libraries_info_lines_out_unless_the_settings_ask_for_debug() -> None:
    info = Settings()
    assert _logged(info, "") == [
        "Joined group",
        "connection lost",
        "owning all 1 input partitions",
        "dead-lettered 3 records",
    ]
    assert _logged(info, "libraries") == ["connection lost", "owning all 1 input partitions", "dead-lettered 3 records"]
    assert _logged(info, "all") == ["connection lost", "dead-lettered 3 records"]
    debug = Settings(logging={"level": "debug"})
    assert len(_logged(debug, "all")) == 4
    # Configured again without quiet, the libraries log as before.
    assert len(_logged(info, "")) == 4


def test_a_secret_escaped_in_a_bytes_repr_or_a_json_string_is_masked_too() -> None:
    # aiokafka logs a SASL PLAIN request's bytes at DEBUG: a non-ASCII password shows as escapes there.
    password = 'grüße-"quoted"-\\-it\'s'
    request_bytes = b"\x00svc\x00" + password.encode()
    messages = [
        f"SaslAuthenticateRequest_v1(sasl_auth_bytes={request_bytes!r})",
        f"plain {password}",
        f"in a tuple {(password,)!r}",
    ]
    fragments = ["grüße", "gr\\xc3\\xbc", "gr\\\\xc3\\\\xbc", "quoted"]
    for formatter in (JsonFormatter([password]), TextFormatter([password])):
        for message in messages:
            line = formatter.format(record("%s", message))
            assert MASK in line
            assert not [fragment for fragment in fragments if fragment in line], (message, line)


def test_a_library_line_repeated_within_the_interval_shows_once_then_with_how_many_were_not_shown() -> None:
    now = [0.0]
    repeats = LibraryRepeats(30.0, clock=lambda: now[0])
    template = "Unable connect to node with id %s: %s"

    def passes(name: str, message: str, *args: object, level: int = logging.ERROR) -> tuple[bool, int | None]:
        entry = logging.makeLogRecord({"name": name, "msg": message, "args": args, "levelno": level})
        return repeats.filter(entry), getattr(entry, "repeats_not_shown", None)

    assert passes("aiokafka", template, 1, "refused") == (True, None)
    now[0] = 10.0
    assert [passes("aiokafka", template, 1, "refused") for _ in range(44)] == [(False, None)] * 44
    # Another text (other arguments: another node or error), level or logger is not a repeat.
    assert passes("aiokafka", template, 2, "refused") == (True, None)
    assert passes("aiokafka", "Unable to update metadata from %s", [1]) == (True, None)
    assert passes("aiokafka", template, 1, "refused", level=logging.WARNING) == (True, None)
    assert passes("aiokafka.consumer.group_coordinator", template, 1, "refused") == (True, None)
    # Our own lines all show.
    assert [passes("streamdedup.service", "lost the broker") for _ in range(3)] == [(True, None)] * 3
    now[0] = 30.5
    assert passes("aiokafka", template, 1, "refused") == (True, 44)
    now[0] = 31.0
    assert passes("aiokafka", template, 1, "refused") == (False, None)
    now[0] = 70.0
    assert passes("aiokafka", template, 1, "refused") == (True, 1)


def test_every_library_line_shows_when_the_settings_say_zero_seconds() -> None:
    lines = []
    for interval in (30, 0):
        stream = io.StringIO()
        configure_logging(Settings(logging={"library_repeat_seconds": interval, "format": "json"}), stream)
        for _ in range(5):
            logging.getLogger("aiokafka").error("Unable connect to node with id %s", 1)
        lines.append([json.loads(line) for line in stream.getvalue().splitlines()])
    assert [line["message"] for line in lines[0]] == ["Unable connect to node with id 1"]
    assert len(lines[1]) == 5


def test_lines_whose_interval_passed_without_a_repeat_are_forgotten_but_an_unreported_count_is_kept() -> None:
    now = [0.0]
    repeats = LibraryRepeats(30.0, clock=lambda: now[0])

    def passed(message: str) -> tuple[bool, int | None]:
        entry = logging.makeLogRecord({"name": "aiokafka", "msg": message, "levelno": logging.DEBUG})
        return repeats.filter(entry), getattr(entry, "repeats_not_shown", None)

    assert passed("repeated") == (True, None)
    assert passed("repeated") == (False, None)
    # DEBUG lines that each differ: held while their interval runs, then dropped.
    assert all(passed(f"request {i}")[0] for i in range(1500))
    now[0] = 31.0
    assert all(passed(f"later {i}")[0] for i in range(1100))
    assert len(repeats._shown) <= 1102
    assert passed("repeated") == (True, 1)
