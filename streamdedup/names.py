"""Names that cross a process boundary, in one place: topics, headers, metrics, LMDB databases."""

from __future__ import annotations

__all__ = [
    "DEAD_LETTER_DECIDE_CRASH",
    "DEAD_LETTER_DECIDE_ERROR",
    "DEAD_LETTER_DECODE_ERROR",
    "DEAD_LETTER_EMPTY_TEXT",
    "DEAD_LETTER_INVALID_JSON",
    "DEAD_LETTER_MISSING_FIELD",
    "DEAD_LETTER_NOT_UTF8",
    "DEAD_LETTER_NULL_VALUE",
    "DEAD_LETTER_OUTPUT_TOO_LARGE",
    "DEAD_LETTER_REASONS",
    "DEAD_LETTER_SIGN_ERROR",
    "DEAD_LETTER_TOO_LARGE",
    "DEAD_LETTER_UNREADABLE",
    "DEFAULT_CONSUMER_GROUP",
    "DEFAULT_DEAD_LETTER_TOPIC",
    "DEFAULT_DUPLICATES_TOPIC",
    "DEFAULT_INPUT_TOPIC",
    "DEFAULT_OUTPUT_TOPIC",
    "HEADER_DEAD_LETTER_DETAIL",
    "HEADER_DEAD_LETTER_ERROR",
    "HEADER_DEAD_LETTER_REASON",
    "HEADER_DEAD_LETTER_TRUNCATED",
    "HEADER_FINGERPRINT",
    "HEADER_MATCH_DISTANCE",
    "HEADER_MATCH_ID",
    "HEADER_MATCH_JACCARD",
    "HEADER_MATCH_REASON",
    "HEADER_MATCH_THRESHOLD",
    "HEADER_SOURCE_OFFSET",
    "HEADER_SOURCE_PARTITION",
    "HEADER_SOURCE_TOPIC",
    "INDEX_DB_CONTENTS",
    "INDEX_DB_ENTRIES",
    "INDEX_DB_FOLDS",
    "INDEX_DB_IDS",
    "INDEX_DB_META",
    "INDEX_DB_ORIGINS",
    "INDEX_DB_SOURCES",
    "INDEX_DB_STAGED",
    "INDEX_DB_TABLE_PREFIX",
    "INDEX_DB_TIMES",
    "INDEX_DB_TOPICS",
    "INDEX_DB_UNDO",
    "METRIC_PREFIX",
    "NOT_DECIDED",
    "NOT_SIGNED",
    "verdicts_topic",
]

# Kafka headers the service adds to what it publishes.
HEADER_FINGERPRINT = "streamdedup-fingerprint"
HEADER_MATCH_ID = "streamdedup-match-id"
HEADER_MATCH_DISTANCE = "streamdedup-match-distance"
HEADER_DEAD_LETTER_REASON = "streamdedup-dead-letter-reason"
# Kafka service: duplicates say whether the match was exact or near; dead letters carry a readable detail;
# both carry where the record came from.
HEADER_MATCH_REASON = "streamdedup-match-reason"
HEADER_DEAD_LETTER_DETAIL = "streamdedup-dead-letter-detail"
HEADER_SOURCE_TOPIC = "streamdedup-source-topic"
HEADER_SOURCE_PARTITION = "streamdedup-source-partition"
HEADER_SOURCE_OFFSET = "streamdedup-source-offset"
# Dead letters of a record that raised: the error's class (ValueError, OverflowError, ...).
HEADER_DEAD_LETTER_ERROR = "streamdedup-dead-letter-error"
# A dead letter cut to fit its topic: the original record's size in bytes (the source headers say where it is).
HEADER_DEAD_LETTER_TRUNCATED = "streamdedup-dead-letter-truncated"
# Duplicates: the estimated Jaccard of the two texts (3 decimals) and the dedup.min_jaccard it was held to
# (absent when dedup.verify is off: then no threshold decided).
HEADER_MATCH_JACCARD = "streamdedup-match-jaccard"
HEADER_MATCH_THRESHOLD = "streamdedup-match-threshold"

# Kafka service: default topics and consumer group (config.yaml kafka section; the transactional id
# derives from the group).
DEFAULT_INPUT_TOPIC = "streamdedup-input"
DEFAULT_OUTPUT_TOPIC = "streamdedup-output"
DEFAULT_DUPLICATES_TOPIC = "streamdedup-duplicates"
DEFAULT_DEAD_LETTER_TOPIC = "streamdedup-dead-letters"
DEFAULT_CONSUMER_GROUP = "streamdedup"

# Why a record went to the dead-letter topic (value of HEADER_DEAD_LETTER_REASON and a metric label).
DEAD_LETTER_INVALID_JSON = "invalid_json"
DEAD_LETTER_MISSING_FIELD = "missing_field"
DEAD_LETTER_NOT_UTF8 = "not_utf8"
DEAD_LETTER_EMPTY_TEXT = "empty_text"
DEAD_LETTER_TOO_LARGE = "too_large"
DEAD_LETTER_NULL_VALUE = "null_value"
# Reading the record raised (a number too long for Python, a time past any float, ...).
DEAD_LETTER_DECODE_ERROR = "decode_error"
# The Kafka client could not parse the record (a header key that is not UTF-8): only its position is known.
DEAD_LETTER_UNREADABLE = "unreadable_record"
# Fingerprinting or sketching the text raised, or the decision core could not decide the document.
DEAD_LETTER_SIGN_ERROR = "sign_error"
DEAD_LETTER_DECIDE_ERROR = "decide_error"
# How a verdict's error begins ("<prefix>: Class: message"), so the service tells the two apart.
NOT_SIGNED = "could not sign this text"
NOT_DECIDED = "not decided"
# What the service would publish for the record is larger than its topic (or the producer) accepts.
DEAD_LETTER_OUTPUT_TOO_LARGE = "output_too_large"
# Deciding the document killed the decision process (a native crash, the OOM killer), found by deciding its batch
# in parts on fresh processes.
DEAD_LETTER_DECIDE_CRASH = "decide_crash"
DEAD_LETTER_REASONS = (
    DEAD_LETTER_INVALID_JSON,
    DEAD_LETTER_MISSING_FIELD,
    DEAD_LETTER_NOT_UTF8,
    DEAD_LETTER_EMPTY_TEXT,
    DEAD_LETTER_TOO_LARGE,
    DEAD_LETTER_NULL_VALUE,
    DEAD_LETTER_DECODE_ERROR,
    DEAD_LETTER_UNREADABLE,
    DEAD_LETTER_SIGN_ERROR,
    DEAD_LETTER_DECIDE_ERROR,
    DEAD_LETTER_OUTPUT_TOO_LARGE,
    DEAD_LETTER_DECIDE_CRASH,
)

METRIC_PREFIX = "streamdedup_"

# LMDB databases of the segment index (streamdedup.index); renaming one orphans existing indexes.
INDEX_DB_META = "meta"
INDEX_DB_TABLE_PREFIX = "table-"
# Table rows waiting to be merged into their table; its name shares the prefix, so it counts as table bytes.
INDEX_DB_STAGED = "table-staged"
INDEX_DB_FOLDS = "folds"
INDEX_DB_ENTRIES = "entries"
INDEX_DB_IDS = "ids"
INDEX_DB_CONTENTS = "contents"
INDEX_DB_TIMES = "times"
INDEX_DB_ORIGINS = "origins"
INDEX_DB_SOURCES = "sources"
INDEX_DB_TOPICS = "topics"
INDEX_DB_UNDO = "undo"


def verdicts_topic(sequence_topic: str) -> str:
    """Scaled out, the topic of the decider's verdict records: the sequence topic's name and ``.verdicts``."""
    return f"{sequence_topic}.verdicts"
