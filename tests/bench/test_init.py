from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest

from streamdedup import bench
from streamdedup.bench import run_bench
from streamdedup.cli import main
from streamdedup.settings import Settings


def test_a_missing_bench_dependency_is_named_with_the_extra_that_brings_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "streamdedup.bench.host", raising=False)
    monkeypatch.delitem(sys.modules, "streamdedup.bench.fingerprint", raising=False)
    # None in sys.modules makes an import fail as if the package were not installed.
    monkeypatch.setitem(sys.modules, "psutil", None)
    with pytest.raises(SystemExit, match=r"bench fingerprint: psutil is not installed; .*streamdedup\[bench\]"):
        run_bench("fingerprint", [], Settings())


def test_other_missing_modules_are_not_blamed_on_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def import_module(name: str, package: str | None = None) -> None:
        raise ModuleNotFoundError("No module named 'numpy'", name="numpy")

    monkeypatch.setattr(bench, "importlib", SimpleNamespace(import_module=import_module))
    with pytest.raises(ModuleNotFoundError, match="numpy"):
        run_bench("fingerprint", [], Settings())


@pytest.mark.parametrize(
    ("argv", "options", "root", "aiokafka"),
    [
        (["bench", "kafka", "--messages", "10"], ["--messages", "10"], logging.WARNING, logging.WARNING),
        (
            ["bench", "kafka", "--messages", "10", "--log-level", "info"],
            ["--messages", "10"],
            logging.INFO,
            logging.NOTSET,
        ),
        (["bench", "--log-level", "DEBUG", "kafka"], [], logging.DEBUG, logging.NOTSET),
    ],
)
def test_bench_logs_warnings_only_unless_a_log_level_is_given_before_or_after_its_name(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], options: list[str], root: int, aiokafka: int
) -> None:
    ran: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(bench, "run_bench", lambda name, given, settings: ran.append((name, list(given))) or 0)
    assert main(argv) == 0
    assert ran == [("kafka", options)]
    assert (logging.getLogger().level, logging.getLogger("aiokafka").level) == (root, aiokafka)
