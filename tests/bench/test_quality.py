from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from streamdedup.bench.quality import PEERS, _best, main, run_peer, split_near_copies
from streamdedup.quality.corpus import CLEARLY_NOVEL, DUPLICATE, OTHER, BenchDoc, load_stream, write_stream
from streamdedup.quality.natural import build_natural, load_natural
from streamdedup.quality.sources import write_records
from streamdedup.settings import Settings

ORIGINAL = "Those who cannot remember the past are condemned to repeat it, wrote Santayana in 1905."
UNRELATED = "Die Kunst ist lang, und kurz ist unser Leben; ein Sonnenstrahl bricht durch die Wolken."
CHINESE = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"

HAND_STREAM = [
    BenchDoc("a", "tune", "en", 0, "original", CLEARLY_NOVEL, 0.0, None, ORIGINAL),
    BenchDoc("b", "tune", "de", 1, "original", CLEARLY_NOVEL, 0.0, None, UNRELATED),
    BenchDoc("c", "tune", "en", 0, "exact", DUPLICATE, 1.0, "a", ORIGINAL),
    BenchDoc("d", "tune", "zh", 2, "original", CLEARLY_NOVEL, 0.0, None, CHINESE),
    BenchDoc("e", "tune", "zh", 2, "exact", DUPLICATE, 1.0, "d", CHINESE),
    BenchDoc("f", "tune", "de", 1, "case", DUPLICATE, 1.0, "b", UNRELATED.upper()),
]


@pytest.mark.parametrize("name", list(PEERS))
def test_each_system_drops_exact_copies_and_keeps_novel_texts(name: str):
    result = run_peer(name, HAND_STREAM, Settings(), "tune")
    report = result.report
    assert report.by_edit["exact"].recall == 1.0
    assert report.overall.loss == 0.0
    assert report.overall.documents == 6 and report.overall.duplicates == 3
    assert result.seconds > 0


@pytest.fixture(scope="module")
def holdout_slice() -> list[BenchDoc]:
    return load_stream(split="holdout")[:400]


@pytest.mark.parametrize("name", list(PEERS))
def test_each_system_runs_on_a_slice_of_the_benchmark(name: str, holdout_slice: list[BenchDoc]):
    docs = holdout_slice
    report = run_peer(name, docs, Settings(), "holdout").report
    assert report.overall.documents == 400
    assert report.overall.duplicates == sum(doc.label == DUPLICATE for doc in docs)
    assert report.by_edit["exact"].recall == 1.0
    # Case and feed artefacts are trivial for the systems that normalise; the simhash package does not.
    if name != "simhash":
        assert report.by_edit["retweet"].recall == 1.0
    assert report.overall.loss is not None and report.overall.loss <= 0.02


NATURAL_PACKAGES = """\
Package: alpha
Description: tool that frobnicates widgets
 Alpha frobnicates widgets quickly and reliably, whatever their size.
 .
 This package contains the command-line tool.

Package: beta
Description: shared objects of the gadget toolkit
 This package contains the command-line tool.
 .
 Beta is the widget library of the frobnication suite.

Package: gamma
Description: tool that frobnicates widgets
"""


def test_main_prints_the_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    stream, natural = tmp_path / "stream.jsonl.xz", tmp_path / "natural.jsonl.xz"
    write_stream([*HAND_STREAM, BenchDoc("g", "holdout", "en", 9, "original", OTHER, 0.6, None, ORIGINAL)], stream)
    write_records(build_natural(NATURAL_PACKAGES), natural)
    out = tmp_path / "quality.json"
    options = ["--stream", str(stream), "--natural", str(natural), "--json", str(out), "--detail", "--repeat", "2"]
    assert main(options, Settings()) == 0
    printed = capsys.readouterr().out
    assert "tune round 2 streamdedup" in printed and "holdout round 2 minhash-0.8" in printed
    assert "natural round 2 rensa: 7 docs" in printed
    for name in PEERS:
        assert name in printed
    results = json.loads(out.read_text())
    assert [(row["split"], row["system"]) for row in results] == [
        (split, name) for split in ("tune", "holdout", "natural") for name in PEERS
    ]
    # Every system drops the two repeated texts of the natural split and publishes no near-copy.
    for row in results:
        if row["split"] == "natural":
            assert row["overall"]["duplicates"] == 2 and row["overall"]["recall"] == 1.0, row["system"]
            assert row["near_copies_published"] == {"count": 0, "kept": 5, "rate": 0.0}
    tune_simhash = next(row for row in results if row["split"] == "tune" and row["system"] == "simhash")
    assert tune_simhash["near_copies_published"] == {"count": 0, "kept": 3, "rate": 0.0}
    assert re.search(r"^natural +goal +>=99\.000% +<=0\.020% +<=0\.050%$", printed, re.MULTILINE)
    assert re.search(r"^tune +simhash .* 0\.000% +0/3 ", printed, re.MULTILINE)
    tune_simhash = next(row for row in results if row["split"] == "tune" and row["system"] == "simhash")
    assert tune_simhash["by_edit"]["exact"]["recall"] == 1.0
    assert tune_simhash["overall"]["clearly_novel"] == 3
    # The speed ratio compares streamdedup with the fastest peer of the same split.
    for split in ("tune", "holdout", "natural"):
        rows = [row for row in results if row["split"] == split]
        ours = next(row["docs_per_second"] for row in rows if row["system"] == "streamdedup")
        fastest = max(row["docs_per_second"] for row in rows if row["system"] != "streamdedup")
        line = next(line for line in printed.splitlines() if line.startswith(f"{split:<8} streamdedup"))
        assert line.endswith(f"{ours / fastest:.1f}x")


def test_repeated_runs_keep_the_fastest_time_and_must_agree():
    docs = HAND_STREAM
    dropped = np.zeros(len(docs), dtype=bool)
    assert _best([(2.0, dropped), (1.5, dropped.copy())], "simhash", docs, "tune").seconds == 1.5
    differing = dropped.copy()
    differing[0] = True
    with pytest.raises(RuntimeError, match="different documents"):
        _best([(2.0, dropped), (1.5, differing)], "simhash", docs, "tune")


def test_unknown_system_is_refused():
    with pytest.raises(SystemExit):
        main(["--systems", "simhash,nonsense"], Settings())


def test_rensa_drops_an_exact_and_a_near_copy_and_keeps_an_unrelated_text():
    near = ORIGINAL.replace("wrote Santayana", "as Santayana wrote")
    docs = [
        BenchDoc("a", "tune", "en", 0, "original", CLEARLY_NOVEL, 0.0, None, ORIGINAL),
        BenchDoc("b", "tune", "en", 0, "exact", DUPLICATE, 1.0, "a", ORIGINAL),
        BenchDoc("c", "tune", "en", 0, "word_replace", DUPLICATE, 0.8, "a", near),
        BenchDoc("d", "tune", "de", 1, "original", CLEARLY_NOVEL, 0.0, None, UNRELATED),
    ]
    result = run_peer("rensa", docs, Settings(), "tune", near=split_near_copies(docs))
    assert PEERS["rensa"](docs, Settings()).tolist() == [False, True, True, False]
    assert (result.report.overall.recall, result.report.overall.loss) == (1.0, 0.0)
    assert (result.kept, result.published) == (2, 0)


def test_natural_split_runs_with_a_limit(capsys: pytest.CaptureFixture[str]):
    assert main(["--split", "natural", "--limit", "300", "--systems", "rensa", "--repeat", "1"], Settings()) == 0
    printed = capsys.readouterr().out
    docs, near = load_natural()
    dropped = PEERS["rensa"](docs[:300], Settings())
    published = int(near.head(300).published(dropped).sum())
    assert "natural round 1 rensa: 300 docs" in printed
    assert re.search(rf"^natural +rensa .* {published}/{300 - int(dropped.sum())} ", printed, re.MULTILINE)


def test_simhash_peer_fingerprints_texts_repeating_a_feature_over_255_times():
    from simhash import Simhash

    from streamdedup.bench.quality import _simhash_of

    text = "abcd " * 200
    counts = Counter(Simhash(0)._tokenize(text))
    # numpy counts give the package's own value where it works (counts up to 255) ...
    assert Simhash({feature: np.int64(count) for feature, count in counts.items()}).value == Simhash(text).value
    assert _simhash_of(Simhash, text).value == Simhash(text).value
    # ... and a value where the package itself overflows.
    with pytest.raises(OverflowError):
        Simhash("abcd " * 300)
    longer = _simhash_of(Simhash, "abcd " * 300)
    assert longer.distance(_simhash_of(Simhash, "abcd " * 301)) <= 3
