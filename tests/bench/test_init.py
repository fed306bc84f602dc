from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from streamdedup import bench
from streamdedup.bench import run_bench
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
