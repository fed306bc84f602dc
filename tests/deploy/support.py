"""Shared by the deployment tests: the files under deploy/, the metric catalogue, effective settings."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from streamdedup.metrics import PartitionLag, ServiceMetrics
from streamdedup.settings import Settings, load_settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
ENV_PREFIX = "STREAMDEDUP_"

# Series Prometheus adds for every target, beside what the service exports.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_yaml_documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _samples() -> list[Any]:
    metrics = ServiceMetrics(input_topics=["in"], output_topics=["out"])
    metrics.record_lag({("in", 0): PartitionLag(records=1, seconds=1.0)})
    return [sample for family in metrics.registry.collect() for sample in family.samples]


def exported_series() -> set[str]:
    """Every sample name the service exposes (``_total``, ``_bucket``, ``_info``, process metrics, ...)."""
    return {sample.name for sample in _samples()}


def exported_labels() -> set[str]:
    """Every label name on those samples, plus the target labels Prometheus attaches."""
    return {label for sample in _samples() for label in sample.labels} | {"job", "instance"}


def series_in(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (identifiers not followed by '(' and not label names)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_matchers = re.sub(r"\{[^}]*\}", "", without_strings)
    without_groupings = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", without_matchers)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_groupings)
    names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", without_ranges))
    keywords = {"and", "or", "unless", "bool", "offset", "inf", "nan", "group_left", "group_right"}
    return {name for name in names if name.lower() not in keywords and not re.fullmatch(r"\d.*", name)}


def grouping_labels(expr: str) -> set[str]:
    labels: set[str] = set()
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels.update(label.strip() for label in group.split(",") if label.strip())
    return labels


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not on PATH; `make promtool` installs Debian's prometheus package")
    return path


def setting_field(env_name: str) -> tuple[str, ...]:
    """The settings key an ``STREAMDEDUP_A__B`` variable sets, checked against the Settings model."""
    assert env_name.startswith(ENV_PREFIX), env_name
    parts = env_name[len(ENV_PREFIX) :].lower().split("__")
    model: type[BaseModel] = Settings
    for depth, part in enumerate(parts):
        fields = model.model_fields
        assert part in fields, f"{env_name}: no setting {'.'.join(parts[: depth + 1])!r}"
        annotation = fields[part].annotation
        if depth < len(parts) - 1:
            assert isinstance(annotation, type) and issubclass(annotation, BaseModel), f"{env_name}: not a section"
            model = annotation
    return tuple(parts)


def effective_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: Mapping[str, str], config_text: str | None
) -> Settings:
    """What the service would run with: ``config_text`` as --config plus ``env``, nothing from this shell."""
    for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith(ENV_PREFIX):
            setting_field(name)
            monkeypatch.setenv(name, str(value))
    path = None
    if config_text is not None:
        path = tmp_path / "config.yaml"
        path.write_text(config_text)
    return load_settings(path)


@dataclass(frozen=True, slots=True)
class Instruction:
    keyword: str
    arguments: str
    stage: int


def dockerfile_instructions(path: Path = DEPLOY / "Dockerfile") -> list[Instruction]:
    """Instructions in order (continuation lines joined, comments dropped), each with its stage number."""
    logical: list[str] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    instructions = []
    stage = -1
    for line in logical:
        keyword, _, arguments = line.partition(" ")
        if keyword.upper() == "FROM":
            stage += 1
        instructions.append(Instruction(keyword.upper(), arguments.strip(), stage))
    return instructions


def dockerfile_env(instructions: list[Instruction]) -> dict[str, str]:
    """ENV of the final stage (``KEY=value`` pairs, shell-quoted values allowed)."""
    final = max(instruction.stage for instruction in instructions)
    env: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "ENV" and instruction.stage == final:
            for pair in shlex.split(instruction.arguments):
                key, _, value = pair.partition("=")
                env[key] = value
    return env
