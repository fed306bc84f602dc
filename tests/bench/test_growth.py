from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest

from streamdedup.bench.growth import main
from streamdedup.bench.growth_corpus import (
    Roots,
    apt_documents,
    build_corpus,
    changelog_documents,
    collect,
    copyright_documents,
    man_documents,
    python_documents,
    read_corpus,
)
from streamdedup.settings import Settings

DUMPAVAIL = """\
Package: hello
Version: 2.10-3
Description: example package based on GNU hello
 The GNU hello program produces a familiar, friendly greeting.
 It allows non-programmers to use a classic computer science tool.
 .
 This package contains the program.
Homepage: https://www.gnu.org/software/hello/

Package: tiny
Version: 1.0
Description: short only
Section: misc
"""

CHANGELOG = """\
hello (2.10-3) unstable; urgency=medium

  * New upstream release.
  * Fix the build with GCC 12,
    thanks to a patch from upstream.
    - Closes: #1000.

 -- Santiago Vila <sanvila@debian.org>  Sun, 18 Sep 2022 19:00:00 +0200

2022-01-02  Jane Doe  <jane@example.org>

\tRewrote the greeting loop.
"""

COPYRIGHT = """\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/

Files: *
Copyright: 1992-2022 Free Software Foundation, Inc.
License: GPL-3+
 This program is free software.
 .
 On Debian systems the full text can be found in /usr/share/common-licenses/GPL-3.
"""

MAN_PAGE = r""".\" A comment that is not text.
.de XX
.ft B
..
.TH HELLO 1 "2022" "GNU hello" "User Commands"
.SH NAME
hello \- friendly greeting program
.SH DESCRIPTION
.PP
The \fBhello\fR program prints a \(lqfriendly\(rq greeting.
See
.BR greet (1)
for more.
.TP
\fB\-t\fR, \fB\-\-traditional\fR
use the traditional greeting
.TS
tab(;);
l l.
a;b
.TE
"""

PYTHON = '''\
"""Greetings for everyone.

A second paragraph of the module's docstring."""
#!not a shebang: a comment that happens to start with one
# Say hello
# to the world.
x = 1  # trailing comments are code notes, not blocks


def greet():
    """Return the greeting."""
    return "hello"
'''


def test_apt_documents_are_short_descriptions_and_long_description_paragraphs() -> None:
    assert list(apt_documents(DUMPAVAIL)) == [
        "example package based on GNU hello",
        "The GNU hello program produces a familiar, friendly greeting. It allows non-programmers to use a classic "
        "computer science tool.",
        "This package contains the program.",
        "short only",
    ]


def test_changelog_documents_are_bullets_and_paragraphs_without_the_entry_metadata() -> None:
    assert list(changelog_documents(CHANGELOG)) == [
        "New upstream release.",
        "Fix the build with GCC 12, thanks to a patch from upstream.",
        "Closes: #1000.",
        "Rewrote the greeting loop.",
    ]


def test_copyright_documents_are_fields_and_paragraphs() -> None:
    assert list(copyright_documents(COPYRIGHT)) == [
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/",
        "Files: *",
        "Copyright: 1992-2022 Free Software Foundation, Inc.",
        "License: GPL-3+ This program is free software.",
        "On Debian systems the full text can be found in /usr/share/common-licenses/GPL-3.",
    ]


def test_man_documents_are_paragraphs_of_running_text_without_roff() -> None:
    assert list(man_documents(MAN_PAGE)) == [
        "hello - friendly greeting program",
        'The hello program prints a "friendly" greeting. See greet(1) for more.',
        "-t, --traditional use the traditional greeting",
    ]


def test_python_documents_are_docstring_paragraphs_and_comment_blocks() -> None:
    assert list(python_documents(PYTHON)) == [
        "Greetings for everyone.",
        "A second paragraph of the module's docstring.",
        "Return the greeting.",
        "Say hello to the world.",
    ]


def _tree(tmp_path: Path) -> Roots:
    doc = tmp_path / "doc"
    for package in ("hello", "hello-data"):
        (doc / package).mkdir(parents=True)
        # Both packages of the source ship the same changelog: it is read once.
        (doc / package / "changelog.Debian.gz").write_bytes(gzip.compress(CHANGELOG.encode()))
    (doc / "hello" / "copyright").write_text(COPYRIGHT)
    (doc / "hello-link").symlink_to(doc / "hello")
    man = tmp_path / "man" / "man1"
    man.mkdir(parents=True)
    (man / "hello.1.gz").write_bytes(gzip.compress(MAN_PAGE.encode()))
    # A Latin-1 translation reads as Latin-1.
    (tmp_path / "man" / "de" / "man1").mkdir(parents=True)
    (tmp_path / "man" / "de" / "man1" / "hello.1.gz").write_bytes(
        gzip.compress(".SH NAME\nhello \\- Grüße\n".encode("latin-1"))
    )
    python = tmp_path / "python3.11"
    python.mkdir()
    (python / "greet.py").write_text(PYTHON)
    return Roots(doc=doc, man=tmp_path / "man", python=(python,), dumpavail=lambda: DUMPAVAIL)


def test_the_corpus_holds_every_document_of_every_source_once_interleaved(tmp_path: Path) -> None:
    roots = _tree(tmp_path)
    per_source = collect(roots)
    assert {source: len(docs) for source, docs in per_source.items()} == {
        "apt": 4,
        "changelog": 4,
        "copyright": 5,
        "man": 4,
        "python": 4,
    }
    assert per_source["man"][0] == "hello - Grüße"

    path = tmp_path / "cache" / "corpus.jsonl"
    counts = build_corpus(path, roots, seed=0)
    assert dict(counts) == {"apt": 4, "changelog": 4, "copyright": 5, "man": 4, "python": 4}
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert sorted((r["id"], r["text"]) for r in records) == sorted(
        (f"{source}-{n}", text) for source, docs in per_source.items() for n, text in enumerate(docs)
    )
    # Interleaved: the file is not the sources one after the other.
    assert [r["id"].split("-")[0] for r in records] != sorted(r["id"].split("-")[0] for r in records)
    # The same seed gives the same file.
    first = path.read_bytes()
    build_corpus(path, roots, seed=0)
    assert path.read_bytes() == first

    lines, head_counts, everything = read_corpus(path, 10)
    assert everything == counts and len(lines) == 10 and sum(head_counts.values()) == 10
    assert head_counts == Counter(orjson.loads(line)["id"].split("-")[0] for line in lines)
    assert lines == first.splitlines(keepends=True)[:10]


def _small_corpus(path: Path, documents: int) -> None:
    """Sentences of a fixed vocabulary; every sixth document repeats an earlier one."""
    rng = np.random.default_rng(7)
    words = [f"word{n}" for n in range(400)]
    texts: list[str] = []
    for n in range(documents):
        if n % 6 == 5:
            texts.append(texts[int(rng.integers(0, len(texts)))])
        else:
            texts.append(" ".join(rng.choice(words, size=int(rng.integers(8, 30)))))
    path.write_bytes(b"".join(orjson.dumps({"id": f"man-{n}", "text": text}) + b"\n" for n, text in enumerate(texts)))


def test_the_growth_run_reports_each_window_and_draws_the_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    _small_corpus(corpus, 3_000)
    chart = tmp_path / "chart" / "growth.png"
    figures = tmp_path / "growth.json"
    options = [
        "--corpus",
        str(corpus),
        "--documents",
        "3000",
        "--window",
        "1000",
        "--chart",
        str(chart),
        "--json",
        str(figures),
    ]
    assert main(options, Settings()) == 0

    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("window"))
    rows = out.splitlines()[out.splitlines().index(header) + 1 :][:3]
    assert [row.split()[0] for row in rows] == ["1", "2", "3"]
    assert "in the corpus: man 3,000" in out and "in this run:   man 3,000" in out
    assert "last window / first window documents/s:" in out and "(goal >= 0.8)" in out

    report = json.loads(figures.read_text())
    windows = report["windows"]
    assert [w["documents"] for w in windows] == [1000, 1000, 1000]
    assert all(w["docs_per_second"] > 0 for w in windows)
    entries = [w["entries"] for w in windows]
    # Every sixth document is an exact copy: dropped; the rest are far apart: kept and stored.
    assert entries == list(np.cumsum([w["kept"] for w in windows]))
    assert entries[-1] == 2_500
    assert all(w["rss_bytes"] > 20 * 2**20 for w in windows)
    assert all(100 < w["disk_per_kept"] < 100_000 for w in windows)
    assert report["ratio_last_first"] == pytest.approx(windows[-1]["docs_per_second"] / windows[0]["docs_per_second"])
    decide_rate = 1 / windows[-1]["decide_per_document"]
    assert f"timed within the run), last window: {decide_rate:,.0f} documents/s" in out
    for row, w in zip(rows, windows, strict=True):
        cells = row.split()
        assert cells[2] == f"{1e6 * w['cpu_per_document']:,.0f}" and w["cpu_per_document"] > 0
        # The decision step is part of the window's time, never all of it (reading and signing are not in it).
        assert cells[3] == f"{1e6 * w['decide_per_document']:,.1f}"
        assert 0 < w["decide_seconds"] < w["seconds"]
        assert cells[5] == f"{w['entries']:,}"
        # An exact copy is compared with its original at least.
        assert w["candidates_max"] >= 1 and cells[-1] == f"{w['candidates_max']:,}"

    png = chart.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(png) > 20_000
