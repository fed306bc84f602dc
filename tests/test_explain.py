"""explain: every intermediate value, and the same decision the service would take."""

from __future__ import annotations

from pathlib import Path

from streamdedup.explain import explain
from streamdedup.settings import Settings, load_settings

SETTINGS = load_settings(Path(__file__).parents[1] / "config.yaml")


def test_explain_near_duplicate() -> None:
    result = explain(
        "Hello, World! The cat sat on the mat today.", "hello world the cat sat on the mat today…", SETTINGS
    )
    assert result.normalized[0] == result.normalized[1] == "hello world the cat sat on the mat today"
    assert result.distance == 0 and result.estimated_jaccard == 1.0
    assert result.fingerprints[0] == result.fingerprints[1]
    assert len(result.fingerprints[0]) == SETTINGS.fingerprint.width // 4
    assert not result.verdict.novel and result.verdict.reason == "exact"


def test_explain_unrelated_texts_are_kept() -> None:
    result = explain("the cat sat on the mat", "stock markets closed higher on friday", SETTINGS)
    assert result.estimated_jaccard < 0.1
    assert result.distance > 0
    assert result.verdict.novel and result.verdict.reason == "novel"


QUICK_FOX = (
    "The quick brown fox jumps over the lazy dog near the river bank this morning.",
    "The quick brown fox jumped over the lazy dog near the river bank this morning!",
)
# One shared segment; b is keyed in 25, so the candidate bound wants 2 shared.
COMMITTEE = (
    "The committee will meet on Monday to discuss the annual budget for the city parks and libraries.",
    "Protesters gathered outside as the committee will meet on Monday to discuss a new stadium deal with investors.",
)
# Three shared segments, an estimated Jaccard just under the default 0.55.
KAFKA = (
    "Apache Kafka is a distributed event store and stream-processing platform developed by the Apache Software "
    "Foundation.",
    "RabbitMQ is a message broker; Apache Kafka is a distributed event store developed by the Apache Software "
    "Foundation in Java.",
)


def _with(section: str, **values: object) -> Settings:
    return SETTINGS.model_copy(update={section: getattr(SETTINGS, section).model_copy(update=values)})


def test_a_near_copy_is_explained_by_its_jaccard_against_the_threshold_and_the_segments_it_shares() -> None:
    result = explain(*QUICK_FOX, SETTINGS)
    assert (result.shared, result.needed, result.keyed, result.tables) == (15, 2, (20, 21), 32)
    assert result.threshold == 0.55 and result.candidate and result.verdict.reason == "near"
    lines = result.lines()
    assert lines[:3] == [
        "b would be dropped as a near copy of a: they share 15 of the fingerprint's 32 segments (2 needed), so the",
        "index compares them, and their estimated Jaccard 0.857 is at least the threshold 0.55 (dedup.min_jaccard).",
        "",
    ]
    assert lines[3:7] == [
        "decision on b:        dropped (near duplicate of a)",
        "estimated jaccard:    0.857 (threshold 0.55, dedup.min_jaccard; bottom-64 MinHash sketches)",
        "shared segments:      15 of 32, 2 needed (keyed: a 20, b 21; 12 or more keyed need 2)",
        "hamming distance:     48 of 1024 bits (no index.radius: it decides nothing)",
    ]


def test_one_shared_segment_is_not_enough_for_a_document_keyed_in_many() -> None:
    result = explain(*COMMITTEE, SETTINGS)
    assert (result.shared, result.needed, result.keyed) == (1, 2, (22, 25)) and not result.candidate
    assert result.verdict.novel
    assert result.summary() == (
        "b would be kept: they share 1 of the fingerprint's 32 segments, and b, keyed in 25 of them, needs 2, so the "
        "index never compares them (estimated Jaccard 0.297, threshold 0.55)."
    )
    # Without a candidate bound one shared segment makes a candidate; the threshold then keeps b.
    unbounded = explain(*COMMITTEE, _with("dedup", max_candidates=None))
    assert unbounded.needed == 1 and unbounded.candidate and unbounded.verdict.novel
    assert unbounded.summary().endswith(
        "so the index compares them, but their estimated Jaccard 0.297 is below the threshold 0.55 (dedup.min_jaccard)."
    )


def test_a_candidate_under_the_threshold_is_kept_and_without_verification_dropped() -> None:
    result = explain(*KAFKA, SETTINGS)
    assert (result.shared, round(result.estimated_jaccard, 3), result.verdict.novel) == (3, 0.506, True)
    assert result.summary() == (
        "b would be kept: they share 3 of the fingerprint's 32 segments, so the index compares them, but their "
        "estimated Jaccard 0.506 is below the threshold 0.55 (dedup.min_jaccard)."
    )
    unverified = explain(*KAFKA, _with("dedup", verify=False))
    assert unverified.threshold is None and (unverified.verdict.reason, unverified.verdict.match_id) == ("near", "a")
    assert (
        "with dedup.verify off every candidate is a duplicate (their estimated Jaccard 0.506 is not checked)"
        in unverified.summary()
    )
    assert (
        "estimated jaccard:    0.506 (dedup.verify off: not checked; bottom-64 MinHash sketches)" in unverified.lines()
    )


def test_a_radius_and_a_text_without_features_are_named_as_what_kept_b() -> None:
    within_3 = explain(*KAFKA, _with("index", radius=3))
    assert within_3.summary() == (
        "b would be kept: their Hamming distance 231 is beyond index.radius 3, so the index never compares them "
        "(estimated Jaccard 0.506, threshold 0.55)."
    )
    assert explain("the cat sat on the mat", "!!!", SETTINGS).summary() == (
        "b would be kept: it has no features to fingerprint, so nothing can match it."
    )
