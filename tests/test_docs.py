"""The documentation stays true to the code: every settings key documented with its default, every documented key
real, the README short and pointing at the two commands, and every relative link of the docs alive."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from streamdedup.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MOST_LINES = 220

# A row of a configuration table: | `section.key` | type | `default` | meaning |
_ROW = re.compile(r"^\|\s*`(?P<key>[a-z0-9_.]+)`\s*\|(?P<type>[^|]*)\|\s*(?P<default>[^|]*?)\s*\|")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)


def _fields(section: type) -> dict[str, Any]:
    """Field name -> annotation of a settings section (a pydantic model or a dataclass)."""
    if isinstance(section, type) and issubclass(section, BaseModel):
        return {name: field.annotation for name, field in section.model_fields.items()}
    if dataclasses.is_dataclass(section):
        hints = typing.get_type_hints(section)
        return {field.name: hints[field.name] for field in dataclasses.fields(section)}
    raise TypeError(f"{section!r} is not a settings section")


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and (issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation))


def _optional_section(annotation: Any) -> type | None:
    """The section an optional field holds (``FeatureSettings | None``), else None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [member for member in typing.get_args(annotation) if member is not type(None)]
        if len(members) == 1 and _is_section(members[0]):
            return members[0]
    return None


def settings_keys(section: type = Settings, prefix: str = "") -> Iterator[str]:
    """Every key a config file can set, dotted (``kafka.security.protocol``). A field holding a section is walked
    into; one holding an optional section (absent by default) is a key of its own."""
    for name, annotation in _fields(section).items():
        if _is_section(annotation):
            yield from settings_keys(annotation, f"{prefix}{name}.")
        else:
            yield prefix + name


def is_settings_key(key: str) -> bool:
    """Whether ``key`` names a field of the settings, through sections and optional sections alike."""
    section: type | None = Settings
    *parents, last = key.split(".")
    for name in parents:
        annotation = _fields(section).get(name) if section is not None else None
        section = annotation if _is_section(annotation) else _optional_section(annotation)
        if section is None:
            return False
    return section is not None and last in _fields(section)


def default_of(key: str) -> Any:
    """The default of a key as a config file would spell it (plain YAML values)."""
    value: Any = Settings().model_dump(mode="json")
    for name in key.split("."):
        value = value[name]
    return value


def _documented_rows() -> dict[str, str]:
    """Key -> the default cell of its row, for every row of every configuration table."""
    rows: dict[str, str] = {}
    for line in CONFIGURATION.read_text(encoding="utf-8").splitlines():
        if match := _ROW.match(line):
            assert match["key"] not in rows, f"{match['key']} is documented twice in {CONFIGURATION.name}"
            rows[match["key"]] = match["default"]
    return rows


def _section_names() -> list[str]:
    return list(_fields(Settings))


def test_the_key_walk_sees_nested_and_optional_sections() -> None:
    keys = set(settings_keys())
    assert {"kafka.group_id", "kafka.security.protocol", "fingerprint.features.char_ngrams"} <= keys
    assert "dedup.sketch_features" in keys and "dedup.sketch_features.word_ngrams" not in keys
    assert is_settings_key("dedup.sketch_features.word_ngrams") and is_settings_key("index.path")
    assert not is_settings_key("kafka.no_such_key") and not is_settings_key("index.path.deeper")


def test_every_settings_key_is_documented_in_configuration_md() -> None:
    documented = _documented_rows()
    missing = [key for key in settings_keys() if key not in documented]
    assert not missing, f"settings keys without a row in docs/configuration.md: {missing}"


def test_every_key_configuration_md_names_exists_in_the_settings() -> None:
    text = CONFIGURATION.read_text(encoding="utf-8")
    dotted = re.compile(rf"^(?:{'|'.join(map(re.escape, _section_names()))})(?:\.[a-z0-9_]+)+$")
    named = {span for span in _CODE_SPAN.findall(text) if dotted.match(span)} | set(_documented_rows())
    unknown = sorted(key for key in named if not is_settings_key(key))
    assert not unknown, f"docs/configuration.md names keys the settings do not have: {unknown}"


def test_configuration_md_gives_each_key_its_default() -> None:
    wrong = {}
    for key, cell in _documented_rows().items():
        if key not in set(settings_keys()):
            continue  # a key inside an optional section: its default is the section's absence
        spans = _CODE_SPAN.findall(cell)
        documented = yaml.safe_load(spans[0]) if len(spans) == 1 else cell
        if documented != default_of(key):
            wrong[key] = (cell, default_of(key))
    assert not wrong, f"defaults in docs/configuration.md that differ from the settings (doc, code): {wrong}"


def test_readme_is_short_and_names_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    assert lines <= README_MOST_LINES, f"README.md has {lines} lines; at most {README_MOST_LINES}"
    assert "make demo" in text and "make test" in text


def _relative_links(document: Path) -> list[str]:
    text = _FENCE.sub("", document.read_text(encoding="utf-8"))
    targets = _INLINE_LINK.findall(text) + _REFERENCE_LINK.findall(text)
    return [
        target
        for target in targets
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) and not target.startswith("#")
    ]


def anchors(document: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered."""
    seen: dict[str, int] = {}
    for line in _FENCE.sub("", document.read_text(encoding="utf-8")).splitlines():
        if heading := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line):
            slug = re.sub(r"[^\w\- ]", "", heading[1].lower()).replace(" ", "-")
            seen[slug] = seen.get(slug, -1) + 1
            if seen[slug]:
                seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_point_at_existing_files(document: Path) -> None:
    broken = []
    for target in _relative_links(document):
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve()
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            broken.append(target)
    assert not broken, f"{document.relative_to(ROOT)} links to files or headings that do not exist: {broken}"


def test_the_link_finder_reads_inline_reference_and_image_links(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "See [ops](docs/operations.md#alerts), ![chart](images/growth.png) and [site](https://example.org).\n"
        "```sh\n[not a link](nowhere.md)\n```\n[ref]: ../config.yaml\n",
        encoding="utf-8",
    )
    assert _relative_links(page) == ["docs/operations.md#alerts", "images/growth.png", "../config.yaml"]


def test_anchors_follow_githubs_headings(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n## `fingerprint`: how a text becomes one\n## Alerts\n## Alerts\n", encoding="utf-8")
    assert anchors(page) == {"title", "fingerprint-how-a-text-becomes-one", "alerts", "alerts-1"}
