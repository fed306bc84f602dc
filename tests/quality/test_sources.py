from __future__ import annotations

from collections import Counter
from pathlib import Path

from streamdedup.quality.sources import (
    FORTUNE_PACKAGES,
    MANPAGE_PACKAGES,
    SourceItem,
    _fortune_texts,
    load_sources,
    write_sources,
)


def test_fortune_files_are_cut_into_cookies(tmp_path: Path):
    base = tmp_path / "usr/share/games/fortunes"
    (base / "off").mkdir(parents=True)
    (base / "wisdom").write_text(
        "A journey of a thousand miles begins with a single step.\n\t\t-- Lao Tzu\n%\nshort\n%\n"
        "\x1b[33mColoured\x1b[m words are still words, and this cookie is long enough.\n%\n",
        encoding="utf-8",
    )
    (base / "wisdom.dat").write_bytes(b"\x00\x01binary index")
    (base / "off" / "rude").write_text("An offensive cookie that must stay out of the benchmark.\n%\n")
    texts = list(_fortune_texts(tmp_path, "en"))
    assert texts == [
        ("usr/share/games/fortunes/wisdom", "A journey of a thousand miles begins with a single step. -- Lao Tzu"),
        ("usr/share/games/fortunes/wisdom", "Coloured words are still words, and this cookie is long enough."),
    ]


def test_sources_round_trip(tmp_path: Path):
    items = [
        SourceItem(
            "fortunes", "fortunes-zh", "2.98", "usr/share/games/fortunes/tang300", "zh", "床前明月光，疑是地上霜。"
        )
    ]
    path = tmp_path / "sources.jsonl.xz"
    assert write_sources(items, path) == 1
    assert load_sources(path) == items


def test_shipped_sources_carry_provenance():
    items = load_sources()
    packages = Counter((item.source, item.package) for item in items)
    assert {package for _, package in packages} == set(FORTUNE_PACKAGES) | set(MANPAGE_PACKAGES)
    assert all(item.version and item.path.startswith("usr/share/") for item in items)
    languages = Counter((item.source, item.lang) for item in items)
    assert len(languages) == 12 and min(languages.values()) >= 1000
