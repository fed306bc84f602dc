"""explain: every intermediate value, and the same decision the service would take."""

from __future__ import annotations

from pathlib import Path

from streamdedup.explain import explain
from streamdedup.settings import load_settings

SETTINGS = load_settings(Path(__file__).parents[1] / "config.yaml")


def test_explain_near_duplicate() -> None:
    result = explain("Hello, World! The cat sat on the mat today.", "hello world the cat sat on the mat today…", SETTINGS)
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
