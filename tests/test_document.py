from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamdedup.document import DeadLetter, Document, DocumentDecoder
from streamdedup.names import DEAD_LETTER_NOT_UTF8, DEAD_LETTER_REASONS
from streamdedup.settings import InputSettings


def decode(value: bytes | None, **settings: object) -> Document | DeadLetter:
    return DocumentDecoder(InputSettings(**settings)).decode(value, default_id="t-0-7", timestamp=1700000000.5)


def test_json_text_field_with_record_defaults() -> None:
    assert decode(b'{"text": "hello world"}') == Document("t-0-7", "hello world", 1700000000.5)


def test_several_nested_text_fields_are_joined_and_id_and_time_come_from_paths() -> None:
    value = json.dumps(
        {"meta": {"id": 42, "at": "2024-01-02T03:04:05+00:00"}, "title": "Breaking", "body": {"parts": ["a", "b"]}}
    ).encode()
    doc = decode(
        value,
        text_fields=["title", "body.parts.1"],
        text_separator=" | ",
        id_field="meta.id",
        time_field="meta.at",
    )
    assert doc == Document("42", "Breaking | b", 1704164645.0)


def test_numeric_event_time_is_epoch_seconds_and_naive_iso_is_utc() -> None:
    assert decode(b'{"text": "x", "ts": 12.25}', time_field="ts") == Document("t-0-7", "x", 12.25)
    assert decode(b'{"text": "x", "ts": "1970-01-01T00:01:00"}', time_field="ts") == Document("t-0-7", "x", 60.0)


def test_text_format_takes_the_whole_value() -> None:
    assert decode("  café {not json\n".encode(), format="text") == Document("t-0-7", "  café {not json\n", 1700000000.5)


@pytest.mark.parametrize(
    ("value", "settings", "reason", "detail"),
    [
        (None, {}, "null_value", "no value"),
        (b"x" * 101, {"max_message_bytes": 100, "format": "text"}, "too_large", "101 bytes"),
        (b'{"text": "\xff\xfe"}', {}, "not_utf8", "not UTF-8"),
        (b"\xc3\x28", {"format": "text"}, "not_utf8", "at byte 0"),
        (b'{"text": "unterminated', {}, "invalid_json", "invalid JSON"),
        (b'["text"]', {}, "invalid_json", "expected a JSON object, got list"),
        (b"[" * 100000, {}, "invalid_json", "invalid JSON"),
        (b'\xef\xbb\xbf{"text": "a"}', {}, "invalid_json", "BOM"),
        (b'{"body": "x"}', {}, "missing_field", "'text'"),
        (b'{"text": null}', {}, "missing_field", "'text'"),
        (b'{"text": {"a": 1}}', {}, "missing_field", "'text'"),
        (b'{"title": "a"}', {"text_fields": ["title", "body"]}, "missing_field", "'body'"),
        (b'{"text": "a"}', {"id_field": "id"}, "missing_field", "no id at field 'id'"),
        (b'{"text": "a", "id": ""}', {"id_field": "id"}, "missing_field", "no id"),
        (b'{"text": "a", "ts": "yesterday"}', {"time_field": "ts"}, "missing_field", "event time"),
        (b'{"text": "a", "ts": true}', {"time_field": "ts"}, "missing_field", "event time"),
        (b'{"text": " \\n\\t "}', {}, "empty_text", "empty"),
        (b"", {"format": "text"}, "empty_text", "empty"),
    ],
)
def test_bad_input_becomes_a_dead_letter_naming_the_reason(
    value: bytes | None, settings: dict[str, object], reason: str, detail: str
) -> None:
    letter = decode(value, **settings)
    assert isinstance(letter, DeadLetter)
    assert (letter.reason, letter.id) == (reason, "t-0-7")
    assert detail in letter.detail
    assert letter.reason in DEAD_LETTER_REASONS


@pytest.mark.parametrize(
    ("value", "text", "doc_id"),
    [
        # Refused by orjson, read by the standard library: a truncated emoji's lone surrogate.
        (b'{"text": "half an emoji \\ud83d", "id": "a"}', "half an emoji \ud83d", "a"),
        # Integers past 64 bits stay exact (orjson would read them as floats).
        (b'{"text": "x", "id": 123456789012345678901234567890}', "x", "123456789012345678901234567890"),
        (b'{"text": "x", "id": -9999999999999999999}', "x", "-9999999999999999999"),
        (b'{"text": "x", "id": 18446744073709551615}', "x", "18446744073709551615"),
    ],
)
def test_records_the_fast_reader_refuses_or_would_change_read_as_the_standard_library_reads_them(
    value: bytes, text: str, doc_id: str
) -> None:
    assert decode(value, id_field="id") == Document(doc_id, text, 1700000000.5)


def test_exactly_max_message_bytes_is_accepted() -> None:
    assert decode(b"y" * 100, format="text", max_message_bytes=100) == Document("t-0-7", "y" * 100, 1700000000.5)


@given(st.binary(max_size=200))
def test_any_bytes_decode_to_a_document_or_a_dead_letter(value: bytes) -> None:
    for fmt in ("json", "text"):
        result = decode(value, format=fmt)
        assert isinstance(result, Document | DeadLetter)
        if isinstance(result, Document):
            assert result.text.strip()


@given(st.text(min_size=1).filter(str.strip), st.text(), st.integers())
def test_json_round_trip_keeps_text_and_id(text: str, other: str, ident: int) -> None:
    value = json.dumps({"text": text, "other": other, "id": ident}).encode()
    assert decode(value, id_field="id") == Document(str(ident), text, 1700000000.5)


def decode_both(values: list[bytes | None], settings: InputSettings) -> tuple[list[object], list[object]]:
    """decode_many's results and decode's, record by record, for the same values."""
    decoder = DocumentDecoder(settings)
    ids = [f"t-0-{n}" for n in range(len(values))]
    times = [1700000000.0 + n for n in range(len(values))]
    origins = [("t", 0, n) for n in range(len(values))]
    many = decoder.decode_many(values, default_ids=ids, timestamps=times, origins=origins)
    each = [
        decoder.decode(value, default_id=ids[n], timestamp=times[n], origin=origins[n])
        for n, value in enumerate(values)
    ]
    return many, each


def test_a_batch_of_plain_records_decodes_column_by_column_as_record_by_record() -> None:
    values = [b'{"id": "a", "text": "first"}', b'{"text": "second", "id": "b", "extra": [1]}']
    many, each = decode_both(values, InputSettings(id_field="id"))
    assert (
        many
        == each
        == [
            Document("a", "first", 1700000000.0, ("t", 0, 0)),
            Document("b", "second", 1700000001.0, ("t", 0, 1)),
        ]
    )


def test_one_bad_record_in_a_batch_is_dead_lettered_alone() -> None:
    values = [b'{"text": "fine"}', b'{"text": "broken', None, b'{"text": "  "}', b'{"text": "also fine"}']
    many, each = decode_both(values, InputSettings())
    assert many == each
    assert [type(item).__name__ for item in many] == ["Document", "DeadLetter", "DeadLetter", "DeadLetter", "Document"]
    assert [item.reason for item in many if isinstance(item, DeadLetter)] == [
        "invalid_json",
        "null_value",
        "empty_text",
    ]
    assert many[4] == Document("t-0-4", "also fine", 1700000004.0, ("t", 0, 4))


@pytest.mark.parametrize("bad_id", [b'""', b"null", b"1.5", b"12345678901234567890123"])
def test_a_record_whose_id_is_empty_or_not_a_plain_string_is_read_on_its_own(bad_id: bytes) -> None:
    values = [b'{"id": "a", "text": "x"}', b'{"id": ' + bad_id + b', "text": "y"}']
    many, each = decode_both(values, InputSettings(id_field="id"))
    assert many == each
    assert many[0] == Document("a", "x", 1700000000.0, ("t", 0, 0))


@pytest.mark.parametrize("bad_id", [b'"\\ud800"', b'"ok\\udfff"', b'"\\ude00\\ud83d"'])
def test_a_record_whose_id_holds_a_lone_surrogate_is_dead_lettered_alone(bad_id: bytes) -> None:
    # JSON escapes can spell lone surrogates; no UTF-8 (nor the index's id map) holds one.
    values = [
        b'{"id": "a", "text": "x"}',
        b'{"id": ' + bad_id + b', "text": "y"}',
        b'{"id": "caf\\u00e9 \\ud83d\\ude00", "text": "z"}',
    ]
    many, each = decode_both(values, InputSettings(id_field="id"))
    assert many == each
    assert many[0] == Document("a", "x", 1700000000.0, ("t", 0, 0))
    letter = many[1]
    assert isinstance(letter, DeadLetter) and (letter.reason, letter.id) == (DEAD_LETTER_NOT_UTF8, "t-0-1")
    assert "lone surrogate" in letter.detail and letter.detail.isascii()
    # A pair of surrogate escapes is one code point: a valid id.
    assert many[2] == Document("caf\u00e9 \U0001f600", "z", 1700000002.0, ("t", 0, 2))


def test_decode_many_wants_one_value_per_default_id_and_timestamp() -> None:
    decoder = DocumentDecoder(InputSettings())
    with pytest.raises(ValueError, match="one length"):
        decoder.decode_many([b'{"text": "a"}'], default_ids=[], timestamps=[0.0])


_FIELD_VALUES = st.one_of(
    st.text(max_size=8), st.integers(), st.floats(allow_nan=False), st.none(), st.booleans(), st.just(2**70)
)
_RECORDS = st.one_of(
    st.fixed_dictionaries({}, optional={"text": _FIELD_VALUES, "title": _FIELD_VALUES, "id": _FIELD_VALUES}).map(
        lambda record: json.dumps(record).encode()
    ),
    st.binary(max_size=20),
    st.none(),
)


@given(
    st.lists(_RECORDS, max_size=6),
    st.sampled_from(
        [
            {},
            {"id_field": "id"},
            {"text_fields": ["title", "text"], "text_separator": " / "},
            {"time_field": "id"},
            {"text_fields": ["meta.text"]},
            {"format": "text"},
            {"max_message_bytes": 25},
        ]
    ),
)
def test_decode_many_gives_what_decode_gives_each_value(
    values: list[bytes | None], settings: dict[str, object]
) -> None:
    # Clamping reads the wall clock, once per batch and once per record: none here, it has tests of its own.
    many, each = decode_both(values, InputSettings(**settings, max_future_seconds=1e300))
    assert many == each


@pytest.mark.parametrize(
    ("value", "settings", "error"),
    [
        # Valid JSON whose integer Python will not read (over 4300 digits).
        (b'{"text": "a", "n": ' + b"9" * 5000 + b"}", {}, "ValueError"),
        (b'{"text": ' + b"9" * 5000 + b"}", {}, "ValueError"),
        # A time no float holds.
        (b'{"text": "a", "ts": ' + b"9" * 400 + b"}", {"time_field": "ts"}, "OverflowError"),
    ],
)
def test_a_record_that_raises_is_dead_lettered_with_the_error_class_alone(
    value: bytes, settings: dict[str, object], error: str
) -> None:
    values = [b'{"text": "before", "ts": 1}', value, b'{"text": "after", "ts": 2}']
    many, each = decode_both(values, InputSettings(**settings))
    assert many == each
    assert [type(item).__name__ for item in many] == ["Document", "DeadLetter", "Document"]
    letter = many[1]
    assert isinstance(letter, DeadLetter)
    assert (letter.reason, letter.error, letter.id) == ("decode_error", error, "t-0-1")
    assert letter.detail.startswith(f"could not read the record: {error}: ")


def test_event_times_far_ahead_of_the_wall_clock_are_clamped_and_counted() -> None:
    now = time.time()
    decoder = DocumentDecoder(InputSettings(time_field="ts", max_future_seconds=60))
    values = [json.dumps({"text": "x", "ts": stamp}).encode() for stamp in (now, now + 30, now * 1000, now + 3600)]
    docs = decoder.decode_many(values, default_ids=["a", "b", "c", "d"], timestamps=[0.0] * 4)
    times = [doc.time for doc in docs if isinstance(doc, Document)]
    assert times[:2] == [now, now + 30]
    assert all(now + 60 <= stamp < time.time() + 60.1 for stamp in times[2:])
    assert decoder.clamped_times == 2


def test_record_timestamps_far_ahead_of_the_wall_clock_are_clamped_and_counted() -> None:
    now = time.time()
    decoder = DocumentDecoder(InputSettings(max_future_seconds=0))
    values = [b'{"text": "x"}', b'{"text": "y"}', b"\xff"]
    docs = decoder.decode_many(values, default_ids=["a", "b", "c"], timestamps=[now - 5, now * 1000, now * 1000])
    assert docs[0] == Document("a", "x", now - 5)
    assert isinstance(docs[1], Document) and now <= docs[1].time <= time.time()
    assert decoder.clamped_times == 2
    single = decoder.decode(b'{"text": "z"}', default_id="d", timestamp=now * 1000)
    assert isinstance(single, Document) and single.time <= time.time()
    assert decoder.clamped_times == 3
