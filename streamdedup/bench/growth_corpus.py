"""The natural-text corpus of ``bench growth``: what the Debian packages of this machine put on it, as documents.

Sources, each cut into documents as a reader would see its units:

- ``apt``: ``apt-cache dumpavail``: each short description, and each paragraph of a long description (where the
  package lists carry them: with ``Acquire::Languages "none"`` they carry only the short ones);
- ``changelog``: ``/usr/share/doc/*/changelog*.gz``: each bullet (``*``, ``-``, ``+``) with its continuation
  lines, or each paragraph without bullets; the lines that head or sign an entry (``pkg (version) dist;
  urgency=``, `` -- Maintainer  date``, ``YYYY-MM-DD  Author``) are the entry's metadata, not its text;
- ``copyright``: ``/usr/share/doc/*/copyright``: each field (``Files:``, ``License:``, ...) and each paragraph;
- ``man``: ``/usr/share/man/**.gz``, every language: roff requests and escapes stripped by a regex pass (no
  groff), paragraphs as documents, section headings as breaks;
- ``python``: ``/usr/lib/python3*``: each docstring paragraph and each block of full-line comments.

Templates and boilerplate (licences, "This package contains ...", "New upstream release") stay: they are what
a near-duplicate filter meets in natural text. Nothing is edited or repeated; a file reached twice (symlinked
doc folders, packages of one source shipping the same changelog) is read once, by its content. The documents
of all sources are interleaved by a fixed-seed shuffle and cached as JSONL (``id``, ``text``); an id is
``<source>-<n>``, so the counts per source can be read back from the cache.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

__all__ = [
    "DEFAULT_CORPUS",
    "SOURCES",
    "Roots",
    "apt_documents",
    "build_corpus",
    "changelog_documents",
    "collect",
    "copyright_documents",
    "ensure_corpus",
    "man_documents",
    "python_documents",
    "read_corpus",
]

SOURCES = ("apt", "changelog", "copyright", "man", "python")
DEFAULT_CORPUS = Path.home() / ".cache" / "streamdedup" / "growth-corpus.jsonl"

_WORD = re.compile(r"\w")
_SPACES = re.compile(r"\s+")


def _dumpavail() -> str:
    return subprocess.run(["apt-cache", "dumpavail"], check=True, capture_output=True, text=True).stdout


@dataclass(frozen=True)
class Roots:
    """Where each source is read from (tests point these at small trees of their own)."""

    doc: Path = Path("/usr/share/doc")
    man: Path = Path("/usr/share/man")
    python: tuple[Path, ...] = field(default_factory=lambda: tuple(sorted(Path("/usr/lib").glob("python3*"))))
    dumpavail: Callable[[], str] = _dumpavail


def _document(lines: Iterable[str]) -> str | None:
    """One document from its lines: whitespace collapsed; None without a single word character."""
    text = _SPACES.sub(" ", " ".join(lines)).strip()
    return text if _WORD.search(text) else None


def _documents(paragraphs: Iterable[list[str]]) -> Iterator[str]:
    for lines in paragraphs:
        if lines and (text := _document(lines)) is not None:
            yield text


# ---------------------------------------------------------------- apt


def apt_documents(dumpavail: str) -> Iterator[str]:
    """Short descriptions and long-description paragraphs (split at `` .`` lines) of a dumpavail text."""
    in_description = False
    paragraph: list[str] = []
    for line in dumpavail.splitlines():
        if line.startswith("Description:"):
            yield from _documents([paragraph])
            paragraph = []
            yield from _documents([[line[len("Description:") :]]])
            in_description = True
        elif in_description and line.startswith(" "):
            if line.strip() == ".":
                yield from _documents([paragraph])
                paragraph = []
            else:
                paragraph.append(line)
        elif in_description:
            yield from _documents([paragraph])
            paragraph = []
            in_description = False
    yield from _documents([paragraph])


# ---------------------------------------------------------------- changelogs

_BULLET = re.compile(r"^\s*[*+-]\s")
_ENTRY_METADATA = re.compile(r"^(?:\S.*\(.*\).*;\s*urgency=|\s?-- .*<.*>\s+\S.*\d{4}|\d{4}-\d\d-\d\d\s+\S)")
_TAG = re.compile(r"<[^>\n]*>")


def changelog_documents(text: str) -> Iterator[str]:
    """Each bullet (with its continuation lines), or each paragraph that has none, of a changelog."""
    paragraph: list[str] = []
    for line in text.splitlines():
        if not line.strip() or _ENTRY_METADATA.match(line):
            yield from _documents([paragraph])
            paragraph = []
        elif _BULLET.match(line):
            yield from _documents([paragraph])
            paragraph = [_BULLET.sub("", line, count=1)]
        else:
            paragraph.append(line)
    yield from _documents([paragraph])


def _changelog_text(raw: str, path: Path) -> str:
    # A few packages ship their changelog as HTML: its tags are markup, not text.
    return _TAG.sub(" ", raw) if ".html" in path.name else raw


# ---------------------------------------------------------------- copyright

_FIELD = re.compile(r"^[A-Za-z][A-Za-z-]*:(?:\s|$)")


def copyright_documents(text: str) -> Iterator[str]:
    """Each field and each paragraph (blank or `` .`` lines between) of a copyright file."""
    paragraph: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped == ".":
            yield from _documents([paragraph])
            paragraph = []
        elif _FIELD.match(line):
            yield from _documents([paragraph])
            paragraph = [line]
        else:
            paragraph.append(line)
    yield from _documents([paragraph])


# ---------------------------------------------------------------- man pages

# Named characters worth keeping; any other is dropped.
_NAMED = {
    "em": "\u2014",
    "en": "\u2013",
    "bu": "\u2022",
    "aq": "'",
    "lq": '"',
    "rq": '"',
    "oq": "'",
    "cq": "'",
    "dq": '"',
    "co": "\u00a9",
    "rg": "\u00ae",
    "hy": "-",
    "mi": "-",
    "ti": "~",
    "ha": "^",
    "bv": "|",
    "ba": "|",
    "sl": "/",
    "rs": "\\",
    "dg": "\u2020",
    "de": "\u00b0",
    "tm": "\u2122",
    "Fo": "\u00ab",
    "Fc": "\u00bb",
    "ga": "`",
    "at": "@",
    "sh": "#",
    "Do": "$",
    "pl": "+",
    "eq": "=",
    "lt": "<",
    "gt": ">",
    "ra": "\u2192",
    "->": "\u2192",
    "<-": "\u2190",
    "mu": "\u00d7",
    "<=": "\u2264",
    ">=": "\u2265",
    "aa": "\u00b4",
}
_ESCAPE = re.compile(
    r"""\\(?:
        ["\#].*                                     # comment to the end of the line
      | [fF](?:\[[^\]\n]*\]|\(..|.)                 # font change
      | s[+-]?(?:\(\d\d|\[\d*\]|\d)                 # size change
      | [*nmgkMYV][+-]?(?:\[[^\]\n]*\]|\(..|.)      # strings, registers, colours
      | [hvwlLoDbxXZNRSAB]'[^'\n]*'                 # motions, boxes and other quoted arguments
      | \((?P<two>..)                               # named character \(xx
      | \[(?P<name>[^\]\n]*)\]                      # named character \[xxx]
      | (?P<char>.)                                 # one-character escape
    )""",
    re.X,
)
_CHARS = {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "t": " ", "'": "'", "`": "`", ".": "."}
# Macros whose arguments are running text: man's font macros and mdoc's inline ones.
_ALTERNATING = frozenset({"BR", "BI", "IB", "IR", "RB", "RI"})
_TEXT_MACROS = frozenset({"B", "I", "SM", "SB", "OP", "SY"}) | _ALTERNATING
_MDOC_INLINE = frozenset(
    "Nm Ar Fl Op Oo Oc Xr Pa Em Dq Do Dc Ql Qo Qc Qq Sq So Sc Va Cm Ic Fn Fa Fo Fc Ft Fd Ev Li Sy No Ns Dv Er Ad "
    "An Lk Mt Ms Tn Ux Bx At Nd Aq Ao Ac Pq Po Pc Brq Bq Vt Cd St Lb In Ot Xo Xc Ta".split()
)
# Requests and macros that end a paragraph (headings included: they break, their words are not prose).
_BREAKS = frozenset("SH SS PP LP P TP TQ IP HP sp nf fi EX EE Sh Ss Pp Lp It Bl El Bd Ed Rs Re".split())
# Blocks whose lines are definitions, tables or equations, up to their end request ("." for the ".." line).
_BLOCKS = {"de": ".", "de1": ".", "am": ".", "ig": ".", "TS": "TE", "EQ": "EN", "PS": "PE"}
_REQUEST = re.compile(r"^[.']\s*(\S*)\s*(.*)$")
_ARGUMENT = re.compile(r'"([^"]*)"?|(\S+)')


def _unescaped(text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        if (two := match.group("two")) is not None:
            return _NAMED.get(two, "")
        if (name := match.group("name")) is not None:
            return _NAMED.get(name, "")
        if (char := match.group("char")) is not None:
            return _CHARS.get(char, "")
        return ""

    return _ESCAPE.sub(replace, text)


def _macro_text(name: str, arguments: str) -> str | None:
    """The running text a macro line carries, or None for a request that carries none."""
    words = [quoted or bare for quoted, bare in _ARGUMENT.findall(arguments)]
    if name in _TEXT_MACROS:
        return ("" if name in _ALTERNATING else " ").join(_unescaped(word) for word in words)
    if name in _MDOC_INLINE:
        return " ".join(_unescaped(word) for word in words if word not in _MDOC_INLINE)
    return None


def man_documents(roff: str) -> Iterator[str]:
    """Paragraphs of running text of a roff (man or mdoc) page."""
    paragraph: list[str] = []
    block_end: str | None = None
    for line in roff.splitlines():
        if block_end is not None:
            if line.startswith((f".{block_end}", f"'{block_end}")):
                block_end = None
            continue
        if line[:1] in (".", "'"):
            request = _REQUEST.match(line)
            name, arguments = request.groups() if request else ("", "")
            if name in _BLOCKS:
                block_end = _BLOCKS[name]
            elif name in _BREAKS:
                yield from _documents([paragraph])
                paragraph = []
            elif (text := _macro_text(name, arguments)) is not None:
                paragraph.append(text)
        elif not line.strip():
            yield from _documents([paragraph])
            paragraph = []
        else:
            paragraph.append(_unescaped(line))
    yield from _documents([paragraph])


# ---------------------------------------------------------------- python

_COMMENT = re.compile(r"^\s*#(?!!)(.*)$")
_DOCSTRING_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def python_documents(source: str) -> Iterator[str]:
    """Docstring paragraphs and blocks of full-line comments of a Python module (comments only when it does not
    parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        tree = None
    if tree is not None:
        for node in ast.walk(tree):
            if isinstance(node, _DOCSTRING_OWNERS) and (docstring := ast.get_docstring(node)):
                yield from _documents(_split_at_blank_lines(docstring.splitlines()))
    block: list[str] = []
    for line in source.splitlines():
        comment = _COMMENT.match(line)
        if comment is not None and comment.group(1).strip():
            block.append(comment.group(1))
        else:
            # A bare "#" separates paragraphs of one comment as a blank line does.
            yield from _documents([block])
            block = []
    yield from _documents([block])


def _split_at_blank_lines(lines: Iterable[str]) -> Iterator[list[str]]:
    paragraph: list[str] = []
    for line in lines:
        if line.strip():
            paragraph.append(line)
        else:
            yield paragraph
            paragraph = []
    yield paragraph


# ---------------------------------------------------------------- assembly


def _decoded(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        # Older translations of man pages are Latin-1.
        return raw.decode("latin-1")


class _Files:
    """Reads each file's text once by its content: a file reached again (a symlinked folder, a copy shipped by
    another package of the same source) yields nothing."""

    def __init__(self) -> None:
        self._seen: set[bytes] = set()

    def text(self, path: Path) -> str | None:
        try:
            raw = path.read_bytes()
            if path.suffix == ".gz":
                raw = gzip.decompress(raw)
        except (OSError, EOFError, gzip.BadGzipFile):
            return None
        digest = hashlib.blake2b(raw, digest_size=16).digest()
        if digest in self._seen:
            return None
        self._seen.add(digest)
        return _decoded(raw)


def _files(pattern_root: Path, pattern: str) -> list[Path]:
    return sorted(path for path in pattern_root.glob(pattern) if path.is_file())


def _man_pages(root: Path) -> list[Path]:
    return sorted(Path(folder) / name for folder, _, names in os.walk(root) for name in names if name.endswith(".gz"))


def _python_files(roots: Iterable[Path]) -> list[Path]:
    return sorted(
        Path(folder) / name
        for root in roots
        for folder, _, names in os.walk(root)
        for name in names
        if name.endswith(".py")
    )


def collect(roots: Roots) -> dict[str, list[str]]:
    """Every document of every source, in file order."""
    files = _Files()
    out: dict[str, list[str]] = {source: [] for source in SOURCES}
    out["apt"].extend(apt_documents(roots.dumpavail()))
    for path in _files(roots.doc, "*/changelog*.gz"):
        if (text := files.text(path)) is not None:
            out["changelog"].extend(changelog_documents(_changelog_text(text, path)))
    for path in _files(roots.doc, "*/copyright"):
        if (text := files.text(path)) is not None:
            out["copyright"].extend(copyright_documents(text))
    for path in _man_pages(roots.man):
        if (text := files.text(path)) is not None:
            out["man"].extend(man_documents(text))
    for path in _python_files(roots.python):
        if (text := files.text(path)) is not None:
            out["python"].extend(python_documents(text))
    return out


def build_corpus(path: Path, roots: Roots, *, seed: int = 0) -> Counter[str]:
    """Collect every document, interleave the sources by a shuffle seeded with ``seed`` and write them all to
    ``path`` as JSONL; the count per source."""
    per_source = collect(roots)
    ids = [f"{source}-{n}" for source in SOURCES for n in range(len(per_source[source]))]
    texts = [text for source in SOURCES for text in per_source[source]]
    order = np.random.default_rng(seed).permutation(len(texts))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as out:
        out.writelines(orjson.dumps({"id": ids[row], "text": texts[row]}) + b"\n" for row in order.tolist())
    partial.replace(path)
    return Counter({source: len(per_source[source]) for source in SOURCES})


def ensure_corpus(path: Path, *, seed: int = 0) -> None:
    """Assemble the corpus at ``path`` (``build_corpus`` from this machine's packages) unless it is there."""
    if path.exists():
        return
    print(f"assembling the corpus into {path} ...", flush=True)
    started = time.perf_counter()
    found = build_corpus(path, Roots(), seed=seed)
    print(f"  {sum(found.values()):,} documents in {time.perf_counter() - started:.0f} s", flush=True)


def read_corpus(path: Path, documents: int) -> tuple[list[bytes], Counter[str], Counter[str]]:
    """The first ``documents`` JSONL lines of the corpus at ``path``, their count per source, and the count per
    source of the whole file."""
    lines: list[bytes] = []
    counts: Counter[str] = Counter()
    everything: Counter[str] = Counter()
    with path.open("rb") as source:
        for line in source:
            if not line.strip():
                continue
            origin = orjson.loads(line)["id"].rpartition("-")[0]
            everything[origin] += 1
            if len(lines) < documents:
                lines.append(line)
                counts[origin] += 1
    return lines, counts, everything
