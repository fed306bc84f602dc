"""The default configuration's near-duplicate quality on the fixed, shipped benchmark stream.

Both splits: ``tune`` (Debian fortunes, which the defaults were chosen on) and ``holdout`` (Debian man pages,
a different source, not tuned on). The thresholds are the issue's: recall >= 0.98, and at most 0.05% of
clearly novel documents lost.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streamdedup.bench.quality import streamdedup_drops
from streamdedup.quality.corpus import load_stream
from streamdedup.quality.evaluate import evaluate
from streamdedup.settings import load_settings

CONFIG = Path(__file__).parents[2] / "config.yaml"


@pytest.mark.parametrize("split", ["tune", "holdout"])
def test_default_config_reaches_the_quality_thresholds(split: str) -> None:
    docs = load_stream(split=split)
    report = evaluate(docs, streamdedup_drops(docs, load_settings(CONFIG)))
    overall = report.overall
    assert overall.duplicates > 15_000 and overall.novel > 13_000
    assert overall.recall >= 0.98
    assert overall.novel_dropped <= 0.0005 * overall.novel
    # No edit kind and no language is left behind.
    assert min(rates.recall for rates in report.by_edit.values() if rates.recall is not None) >= 0.90
    assert min(rates.recall for rates in report.by_lang.values() if rates.recall is not None) >= 0.97
