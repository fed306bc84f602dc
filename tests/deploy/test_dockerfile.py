"""deploy/Dockerfile: multi-stage, slim, non-root, the index on a volume, consistent with the package."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from streamdedup.cli import main
from tests.deploy.support import DEPLOY, REPO, dockerfile_env, dockerfile_instructions, effective_settings

INSTRUCTIONS = dockerfile_instructions()
FINAL_STAGE = max(instruction.stage for instruction in INSTRUCTIONS)


def final(keyword: str) -> list[str]:
    return [i.arguments for i in INSTRUCTIONS if i.keyword == keyword and i.stage == FINAL_STAGE]


def test_multi_stage_on_slim_images() -> None:
    stages = [i.arguments for i in INSTRUCTIONS if i.keyword == "FROM"]
    assert len(stages) >= 2
    assert all("slim" in stage for stage in stages)
    assert re.search(r"\bAS build\b", stages[0])
    # The runtime stage takes only the built virtualenv from the build stage, no compiler or sources.
    copies = final("COPY")
    assert any(copy.startswith("--from=build ") for copy in copies)
    assert not any(copy.split()[0] == "streamdedup" for copy in copies)


def test_runs_as_a_numeric_non_root_user() -> None:
    (user,) = final("USER")
    uid, _, gid = user.partition(":")
    assert int(uid) > 0 and int(gid or uid) > 0
    run = " ".join(final("RUN"))
    assert f"--uid {uid}" in run and "useradd" in run


def test_index_lives_on_the_declared_volume(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (volume,) = final("VOLUME")
    (volume_path,) = json.loads(volume)
    settings = effective_settings(
        monkeypatch, tmp_path, dockerfile_env(INSTRUCTIONS), (REPO / "config.yaml").read_text()
    )
    assert settings.index.path.is_absolute()
    assert settings.index.path.is_relative_to(volume_path)
    # The user owns the volume directory, so a fresh named volume is writable.
    assert f"chown -R streamdedup:streamdedup {volume_path}" in " ".join(final("RUN"))


def test_every_env_variable_is_a_setting_and_the_port_is_exposed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = dockerfile_env(INSTRUCTIONS)
    settings = effective_settings(monkeypatch, tmp_path, env, (REPO / "config.yaml").read_text())
    assert final("EXPOSE") == [str(settings.metrics.port)]
    assert settings.metrics.host == "0.0.0.0"
    assert settings.logging.format == "json"
    (healthcheck,) = final("HEALTHCHECK")
    assert f"http://127.0.0.1:{settings.metrics.port}/healthz" in healthcheck


def test_entrypoint_is_the_installed_script_with_the_copied_config() -> None:
    (entrypoint,) = final("ENTRYPOINT")
    (cmd,) = final("CMD")
    program, flag, config_path = json.loads(entrypoint)
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert program in scripts and flag == "--config"
    assert any(shlex.split(copy) == ["config.yaml", config_path] for copy in final("COPY"))
    # The subcommand exists: its --help exits cleanly.
    with pytest.raises(SystemExit) as exited:
        main([*json.loads(cmd), "--help"])
    assert exited.value.code == 0


def test_build_context_holds_what_the_copies_need() -> None:
    ignore = [
        line
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    copies = [i.arguments for i in INSTRUCTIONS if i.keyword == "COPY" and not i.arguments.startswith("--from")]
    sources = [source for copy in copies for source in shlex.split(copy)[:-1]]
    assert sources
    for source in sources:
        assert (REPO / source).exists(), source
        assert _included(source, ignore), f"{source} is excluded by Dockerfile.dockerignore"
    # pyproject's readme must be in the context for the package build.
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["readme"] in sources


def _included(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; '!' re-includes."""
    included = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.removeprefix("!").rstrip("/")
        if fnmatch.fnmatch(path, glob) or fnmatch.fnmatch(path.rstrip("/"), glob):
            included = negated
    return included
