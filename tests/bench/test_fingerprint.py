from __future__ import annotations

import re
from pathlib import Path

import pytest

from streamdedup.bench.fingerprint import SOURCES, _cycle, _pack, _read, main
from streamdedup.settings import Settings

ROWS = (
    "streamdedup Fingerprinter.fingerprint",
    "simhash Simhash(text)",
    "datasketch MinHash(128).update_batch, char 5-grams",
    "rensa RMinHash digest matrix (128), char 5-grams",
    "streamdedup BottomK(128), char 5-grams",
    "streamdedup Fingerprinter.fingerprint, 10-20 kB",
    "simhash Simhash(text), 10-20 kB",
)


def test_a_small_bench_prints_every_contestant_and_ratios_of_its_own_rates(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        [
            "--tweets",
            "300",
            "--batch",
            "100",
            "--long-docs",
            "4",
            "--long-batch",
            "2",
            "--peer-sample",
            "60",
            "--rounds",
            "2",
        ],
        Settings(),
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "(300 texts of 100-300 bytes)" in out
    assert "packed into 4 documents of 10-20 kB" in out
    rates = {}
    for name in ROWS:
        row = re.search(rf"^{re.escape(name)} +([\d,]+) +([\d.]+) +(\d+ %|n/a)$", out, re.MULTILINE)
        assert row is not None, name
        rates[name] = float(row[1].replace(",", ""))
        assert rates[name] > 0
    ours = rates["streamdedup Fingerprinter.fingerprint"]
    bottom_k = rates["streamdedup BottomK(128), char 5-grams"]
    rensa = "rensa RMinHash digest matrix (128), char 5-grams"
    for first, label, theirs in (
        (ours, "Fingerprinter / simhash", "simhash Simhash(text)"),
        (ours, "Fingerprinter / datasketch MinHash", "datasketch MinHash(128).update_batch, char 5-grams"),
        (ours, "Fingerprinter / rensa MinHash", rensa),
        (bottom_k, "BottomK / rensa MinHash", rensa),
    ):
        printed = re.search(rf"ratio {label}: +([\d.]+)x", out)
        assert printed is not None, label
        # The rates are printed rounded to whole documents: the ratio agrees with them to that precision.
        assert float(printed[1]) == pytest.approx(first / rates[theirs], rel=0.02, abs=0.1)
    assert re.search(r"^10-20 kB documents: +[\d.]+ MB/s \(goal >= 50 MB/s\)$", out, re.MULTILINE)
    assert re.search(
        r"^host CPU steal \(other tenants' share of the cores\): (\d+ %|n/a) over all rounds", out, re.MULTILINE
    )


def test_long_documents_are_packed_to_10_to_20_kb_from_whole_texts() -> None:
    documents = _pack(_read(SOURCES)[:3000], 10_000, 20_000)
    sizes = [len(document.encode("utf-8")) for document in documents]
    assert len(documents) > 10
    assert min(sizes) >= 10_000
    assert max(sizes) <= 20_000


def test_pack_counts_the_newlines_between_texts_only() -> None:
    assert _pack(["a" * 4, "b" * 5], 10, 20) == ["aaaa\nbbbbb"]
    # Nine bytes with the one newline: short of ten, so no document yet.
    assert _pack(["a" * 4, "b" * 4], 10, 20) == []
    assert _pack(["a" * 30], 10, 20) == ["a" * 20]


def test_a_corpus_file_may_mix_jsonl_records_and_plain_lines(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        '{"text": "from a record"}\nplain line\n\n{"text": "  "}\n{"id": 3}\n["a list"]\n', encoding="utf-8"
    )
    assert _read(corpus) == ["from a record", "plain line"]


def test_a_corpus_without_texts_of_the_needed_sizes_is_refused() -> None:
    assert _cycle(["x", "y"], 5) == ["x", "y", "x", "y", "x"]
    with pytest.raises(SystemExit, match="no texts of the sizes"):
        _cycle([], 5)
