"""The real source texts of the quality benchmark: where they come from, how they are cut, how they are read.

Two unrelated sources, so the default configuration can be tuned on one and measured on the other:

- ``fortunes`` (tune split): the Debian fortune-cookie packages in English, German, Spanish, Italian, Russian
  and Chinese; one cookie is one item, its line breaks folded to spaces.
- ``manpages`` (holdout split): the Debian manual-page packages in the same six languages, rendered with
  groff; one paragraph is one item.

:func:`extract_packages` reads the ``.deb`` files (``apt-get download`` them) and is only needed to rebuild the
shipped file; :func:`load_sources` reads the shipped, xz-compressed ``sources.jsonl.xz``.
"""

from __future__ import annotations

import gzip
import json
import lzma
import re
import subprocess
import tempfile
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DATA_DIR",
    "FORTUNE_PACKAGES",
    "MANPAGE_PACKAGES",
    "SOURCES_FILE",
    "SourceItem",
    "extract_packages",
    "load_sources",
    "write_records",
    "write_sources",
]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
SOURCES_FILE = DATA_DIR / "sources.jsonl.xz"

# Debian package -> language of its texts.
FORTUNE_PACKAGES = {
    "fortunes": "en",
    "fortunes-de": "de",
    "fortunes-es": "es",
    "fortunes-it": "it",
    "fortunes-ru": "ru",
    "fortunes-zh": "zh",
}
MANPAGE_PACKAGES = {
    "manpages": "en",
    "manpages-de": "de",
    "manpages-es": "es",
    "manpages-it": "it",
    "manpages-ru": "ru",
    "manpages-zh": "zh",
}

# Items outside these bounds (code points, after folding whitespace) are not feed-sized; a Chinese character
# carries about as much as a short word, so Chinese items may be shorter.
MIN_CHARS = {"zh": 16}
DEFAULT_MIN_CHARS = 40
MAX_CHARS = 1000

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_COOKIE_SEPARATOR = re.compile(r"\n%\n")
_WHITESPACE = re.compile(r"\s+")
# Man-page paragraphs that are option lists, synopses or tables rather than prose.
_CODE_LIKE = re.compile(r"[{}<>|\[\]=$\\/]{3,}|^\s*-{1,2}\w|\w\(\d\)(,\s*[\w.-]+\(\d\)){2,}")
# Translated packages leave some texts untranslated; these words give English away.
_ENGLISH_WORDS = frozenset("the and of to is in this that with for are be it on as by not or an".split())


@dataclass(frozen=True, slots=True)
class SourceItem:
    """One feed-sized text cut from a source package."""

    source: str  # "fortunes" or "manpages"
    package: str
    version: str
    path: str  # file inside the package the text was cut from
    lang: str
    text: str


def load_sources(path: Path = SOURCES_FILE) -> list[SourceItem]:
    """Read the shipped source texts (xz-compressed JSON lines), in file order."""
    with lzma.open(path, "rt", encoding="utf-8") as lines:
        return [SourceItem(**json.loads(line)) for line in lines]


def write_sources(items: Iterable[SourceItem], path: Path = SOURCES_FILE) -> int:
    """Write the source texts as xz-compressed JSON lines; returns how many."""
    return write_records(items, path)


def write_records(records: Iterable[Any], path: Path) -> int:
    """Dataclass records as xz-compressed JSON lines (fixed key order, so rebuilds are byte-identical)."""
    count = 0
    with lzma.open(path, "wt", encoding="utf-8", preset=9 | lzma.PRESET_EXTREME) as out:
        for record in records:
            out.write(json.dumps(asdict(record), ensure_ascii=False) + "\n")
            count += 1
    return count


def extract_packages(deb_dir: Path) -> list[SourceItem]:
    """Cut every feed-sized text out of the fortune and man-page ``.deb`` files in ``deb_dir``.

    Needs ``dpkg-deb`` and ``groff`` (for man pages). Items come out in a fixed order (package, path, position).
    """
    items: list[SourceItem] = []
    packages = {
        **{name: ("fortunes", lang) for name, lang in FORTUNE_PACKAGES.items()},
        **{name: ("manpages", lang) for name, lang in MANPAGE_PACKAGES.items()},
    }
    for name, (source, lang) in packages.items():
        debs = sorted(deb_dir.glob(f"{name}_*.deb"))
        if len(debs) != 1:
            raise FileNotFoundError(f"expected exactly one {name}_*.deb in {deb_dir}, found {len(debs)}")
        version = _deb_field(debs[0], "Version")
        with tempfile.TemporaryDirectory() as tree:
            subprocess.run(["dpkg-deb", "-x", str(debs[0]), tree], check=True)
            root = Path(tree)
            texts = _fortune_texts(root, lang) if source == "fortunes" else _manpage_texts(root, lang)
            for relative, text in texts:
                items.append(SourceItem(source, name, version, relative, lang, text))
    return items


def _deb_field(deb: Path, field: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), field], check=True, capture_output=True, text=True
    ).stdout.strip()


def _fortune_texts(root: Path, lang: str) -> Iterator[tuple[str, str]]:
    base = root / "usr/share/games/fortunes"
    for path in sorted(base.rglob("*")):
        relative = path.relative_to(root).as_posix()
        # .dat are strfile indexes, .u8 are locale variants of the same cookies; the offensive sections stay out.
        if path.is_symlink() or not path.is_file() or path.suffix in (".dat", ".u8") or "/off/" in f"/{relative}/":
            continue
        if path.name.endswith("-pre"):
            continue
        text = _ANSI_ESCAPE.sub("", path.read_bytes().decode("utf-8", errors="replace"))
        for cookie in _COOKIE_SEPARATOR.split(text.replace("\r\n", "\n")):
            folded = _fold(cookie)
            if _is_prose(folded, lang):
                yield relative, folded


def _manpage_texts(root: Path, lang: str) -> Iterator[tuple[str, str]]:
    base = root / "usr/share/man"
    locale_dirs = {"en": base, "zh": base / "zh_CN"}
    pages = sorted((locale_dirs.get(lang, base / lang)).glob("man[1-8]/*.gz"))
    for page in pages:
        relative = page.relative_to(root).as_posix()
        source = gzip.decompress(page.read_bytes())
        if source.lstrip().startswith(b".so "):
            continue  # a link to another page
        rendered = subprocess.run(
            # A very long line and no hyphenation: each paragraph comes out as one line.
            ["groff", "-k", "-man", "-Tutf8", "-rLL=4000n", "-rHY=0", "-P-cbou"],
            input=source,
            capture_output=True,
            check=False,
        ).stdout.decode("utf-8", errors="replace")
        for line in rendered.splitlines():
            if not line.startswith("       ") or line.startswith("              "):
                continue  # headings, page headers and footers, deeper-indented option descriptions' tails
            folded = _fold(line)
            if _is_prose(folded, lang) and not _CODE_LIKE.search(folded):
                yield relative, folded


def _fold(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip()


def _is_prose(text: str, lang: str) -> bool:
    if not MIN_CHARS.get(lang, DEFAULT_MIN_CHARS) <= len(text) <= MAX_CHARS:
        return False
    letters = sum(1 for char in text if unicodedata.category(char).startswith("L"))
    # ASCII art, tables and overstruck text are mostly not letters.
    if letters < 0.6 * len(text) or "\b" in text or "\ufffd" in text:
        return False
    if lang not in ("en", "zh"):
        words = text.lower().split()
        return sum(word in _ENGLISH_WORDS for word in words) < 0.12 * len(words)
    return True
