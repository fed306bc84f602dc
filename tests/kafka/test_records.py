from __future__ import annotations

import numpy as np
from aiokafka.structs import ConsumerRecord

from streamdedup.document import DeadLetter
from streamdedup.fingerprint import fingerprint_hex
from streamdedup.kafka.records import (
    OutgoingRecord,
    dead_letter,
    duplicate,
    novel,
    record_bytes,
    truncated_dead_letter,
)


def record(value: bytes | None, headers: list[tuple[str, bytes]]) -> ConsumerRecord:
    return ConsumerRecord(
        topic="news",
        partition=3,
        offset=41,
        timestamp=1_700_000_000_000,
        timestamp_type=0,
        key=b"k",
        value=value,
        checksum=None,
        serialized_key_size=1,
        serialized_value_size=len(value or b""),
        headers=headers,
    )


def test_fingerprint_hex_reads_the_bits_left_to_right_word_by_word() -> None:
    words = np.array([[1 << 63, 0xABCDEF], [0, 1]], dtype=np.uint64)
    assert fingerprint_hex(words) == ["8000000000000000" + "0000000000abcdef", "0" * 31 + "1"]


def test_novel_keeps_key_value_and_headers_and_adds_the_fingerprint() -> None:
    out = novel(record(b"v", [("a", b"1")]), "out", "00000000000000ff")
    assert out == OutgoingRecord("out", b"v", b"k", (("a", b"1"), ("streamdedup-fingerprint", b"00000000000000ff")))


def test_duplicate_names_match_distance_reason_jaccard_threshold_and_source() -> None:
    out = duplicate(
        record(b"v", []), "dups", "0000000000000000", "near", "news-3-7", 2, jaccard=0.859375, threshold=0.55
    )
    assert out.headers == (
        ("streamdedup-fingerprint", b"0000000000000000"),
        ("streamdedup-match-id", b"news-3-7"),
        ("streamdedup-match-distance", b"2"),
        ("streamdedup-match-reason", b"near"),
        ("streamdedup-match-jaccard", b"0.859"),
        ("streamdedup-match-threshold", b"0.55"),
        ("streamdedup-source-topic", b"news"),
        ("streamdedup-source-partition", b"3"),
        ("streamdedup-source-offset", b"41"),
    )


def test_a_duplicate_without_a_threshold_or_jaccard_leaves_those_headers_out() -> None:
    # dedup.verify off: no threshold decided.
    headers = dict(
        duplicate(record(b"v", []), "dups", "00", "exact", "news-3-7", 0, jaccard=1.0, threshold=None).headers
    )
    assert headers["streamdedup-match-jaccard"] == b"1.000" and "streamdedup-match-threshold" not in headers
    bare = dict(duplicate(record(b"v", []), "dups", "00", "near", "news-3-7", 9, jaccard=None, threshold=None).headers)
    assert "streamdedup-match-jaccard" not in bare and bare["streamdedup-match-distance"] == b"9"


def test_dead_letter_keeps_the_original_bytes_and_cuts_a_long_detail_on_a_character_boundary() -> None:
    letter = DeadLetter("not_utf8", "é" * 5000, "news-3-41")
    out = dead_letter(record(b"\xff\xfe", [("trace", b"x")]), "dlq", letter)
    assert (out.topic, out.value, out.key) == ("dlq", b"\xff\xfe", b"k")
    headers = dict(out.headers)
    assert headers["trace"] == b"x"
    assert headers["streamdedup-dead-letter-reason"] == b"not_utf8"
    assert headers["streamdedup-dead-letter-detail"].decode() == "é" * 1000
    assert (headers["streamdedup-source-topic"], headers["streamdedup-source-offset"]) == (b"news", b"41")


def test_a_dead_letter_of_a_record_that_raised_names_the_error_class() -> None:
    letter = DeadLetter(
        "decode_error", "could not read the record: ValueError: too many digits", "news-3-41", "ValueError"
    )
    headers = dict(dead_letter(record(b"{}", []), "dlq", letter).headers)
    assert headers["streamdedup-dead-letter-error"] == b"ValueError"
    assert "streamdedup-dead-letter-error" not in dict(
        dead_letter(record(b"{}", []), "dlq", DeadLetter("x", "y", "z")).headers
    )


def test_a_dead_letter_too_large_for_its_topic_is_cut_to_fit_keeping_key_and_headers() -> None:
    big = record(b"v" * 50_000, [("trace", b"t")])
    letter = DeadLetter("too_large", "value is 50000 bytes", "news-3-41")
    whole = dead_letter(big, "dlq", letter)
    out = truncated_dead_letter(big, "dlq", letter, 10_000)
    assert record_bytes(out) <= 10_000 < record_bytes(whole)
    assert (
        (out.topic, out.key) == ("dlq", b"k")
        and 9_000 < len(out.value or b"")
        and big.value.startswith(out.value or b"x")
    )
    headers = dict(out.headers)
    assert headers["trace"] == b"t"
    assert headers["streamdedup-dead-letter-truncated"] == str(record_bytes(whole)).encode()
    assert (headers["streamdedup-dead-letter-reason"], headers["streamdedup-source-offset"]) == (b"too_large", b"41")
    # Headers too large to keep: the dead letter's own headers only, and as much of the value as fits.
    loud = record(b"v" * 50_000, [("trace", b"t" * 20_000)])
    cut = truncated_dead_letter(loud, "dlq", letter, 10_000)
    assert record_bytes(cut) <= 10_000 and cut.key is None and "trace" not in dict(cut.headers)
    assert dict(cut.headers)["streamdedup-source-topic"] == b"news" and len(cut.value or b"") > 8_000
