from __future__ import annotations

import pytest

from streamdedup.quality.corpus import CLEARLY_NOVEL, DUPLICATE, OTHER, BenchDoc
from streamdedup.quality.evaluate import evaluate


def doc(number: int, label: str, edit: str, lang: str) -> BenchDoc:
    return BenchDoc(f"d{number}", "tune", lang, number, edit, label, 0.0, None, f"text {number}")


DOCS = [
    doc(0, CLEARLY_NOVEL, "original", "en"),
    doc(1, CLEARLY_NOVEL, "original", "zh"),
    doc(2, DUPLICATE, "retweet", "en"),
    doc(3, DUPLICATE, "retweet", "zh"),
    doc(4, DUPLICATE, "truncate", "en"),
    doc(5, OTHER, "original", "en"),
    doc(6, CLEARLY_NOVEL, "original", "en"),
    doc(7, DUPLICATE, "original", "zh"),
]


def test_recall_and_loss_by_hand():
    dropped = [False, True, True, True, False, True, False, True]
    report = evaluate(DOCS, dropped)
    assert report.overall.recall == pytest.approx(3 / 4)
    assert report.overall.loss == pytest.approx(1 / 3)
    assert report.overall.documents == 8
    assert report.by_edit["retweet"].recall == 1.0
    assert report.by_edit["truncate"].recall == 0.0
    assert report.by_edit["truncate"].loss is None
    assert report.by_edit["original"].recall == 1.0  # the source's own near-duplicate (doc 7)
    assert report.by_edit["original"].loss == pytest.approx(1 / 3)
    assert report.by_lang["en"].recall == pytest.approx(1 / 2)
    assert report.by_lang["en"].loss == 0.0
    assert report.by_lang["zh"].recall == 1.0
    assert report.by_lang["zh"].loss == 1.0


def test_other_counts_nowhere():
    dropped = [False] * 8
    dropped[5] = True
    report = evaluate(DOCS, dropped)
    assert report.overall.recall == 0.0
    assert report.overall.loss == 0.0


def test_as_dict_carries_the_rates():
    report = evaluate(DOCS, [True] * 8).as_dict()
    assert report["overall"]["recall"] == 1.0
    assert report["overall"]["loss"] == 1.0
    assert report["by_lang"]["zh"]["clearly_novel"] == 1


def test_decision_count_must_match():
    with pytest.raises(ValueError, match="expected 8 decisions, got 7"):
        evaluate(DOCS, [False] * 7)
