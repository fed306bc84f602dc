"""Names that cross a process boundary, in one place: topics, headers, metrics, LMDB databases."""

from __future__ import annotations

__all__ = [
    "HEADER_FINGERPRINT",
    "HEADER_MATCH_DISTANCE",
    "HEADER_MATCH_ID",
    "HEADER_DEAD_LETTER_REASON",
    "METRIC_PREFIX",
]

# Kafka headers the service adds to what it publishes.
HEADER_FINGERPRINT = "streamdedup-fingerprint"
HEADER_MATCH_ID = "streamdedup-match-id"
HEADER_MATCH_DISTANCE = "streamdedup-match-distance"
HEADER_DEAD_LETTER_REASON = "streamdedup-dead-letter-reason"

METRIC_PREFIX = "streamdedup_"
