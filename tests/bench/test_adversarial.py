"""The adversarial streams: what they plant, and the table the benchmark prints."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from streamdedup.bench.adversarial import boilerplate_stream, main, plant_copies, template_stream
from streamdedup.settings import Settings
from tests.bench.test_growth import _small_corpus


def test_planted_copies_follow_their_originals_and_leave_the_rest_in_order() -> None:
    texts = [f"text {n}" for n in range(1000)]
    planted = plant_copies(texts, 0.02, random.Random(5))
    assert len(planted.copy_of) == 20 and len(planted.texts) == 1020
    assert [text for position, text in enumerate(planted.texts) if position not in planted.copy_of] == texts
    for copy, original in planted.copy_of.items():
        assert original < copy and original not in planted.copy_of
        assert planted.texts[copy] in (planted.texts[original], planted.texts[original] + " (fast)")


def test_the_streams_are_one_template_and_one_boilerplate() -> None:
    template = template_stream(500, 0.02, seed=3)
    assert all(" is a Python library for " in text for text in template.texts)
    # Distinct texts apart from the planted copies.
    assert len(set(template.texts)) >= 500 - 1
    boilerplate = boilerplate_stream(500, 0.02, seed=3)
    originals = [text for position, text in enumerate(boilerplate.texts) if position not in boilerplate.copy_of]
    assert len(set(originals)) == 500 and len({text.rsplit(" ", 1)[0] for text in originals}) == 1


def test_the_bench_prints_rate_candidates_and_copies_caught(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "corpus.jsonl"
    _small_corpus(corpus, 2_000)
    assert main(["--corpus", str(corpus), "--documents", "2000", "--window", "1000"], Settings()) == 0
    out = capsys.readouterr().out
    table = out[out.index("stream ") :].splitlines()
    rows = {line.split()[0]: line.split() for line in table[1:4]}
    assert list(rows) == ["natural", "template", "boilerplate"]
    assert rows["natural"][1] == "2,000" and rows["natural"][3] == "1.00x" and rows["natural"][-2] == "-"
    # Every planted copy is caught, and no document is compared with more than the bound.
    settings = Settings()
    bound = 2 * settings.dedup.max_candidates + settings.fingerprint.segments
    for name in ("template", "boilerplate"):
        assert rows[name][1] == "2,020" and rows[name][-2] == "20/20"
        assert 0 < int(rows[name][6].replace(",", "")) <= bound
    # The template's texts are all kept but the copies; the boilerplate's are near copies of the first.
    assert rows["template"][-1] == "2,000" and int(rows["boilerplate"][-1]) < 20
