"""Benchmarks: each runs streamdedup and the peers its issue names in the same run and prints ratios."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from ..settings import Settings

__all__ = ["BENCHMARKS", "LONG_BENCHMARKS", "run_bench"]

BENCHMARKS = ("fingerprint", "index", "kafka", "quality")  # what `bench all` runs
LONG_BENCHMARKS = ("growth", "adversarial", "scale")  # minutes each: run by name only
# The bench extra: the peers and what the benches measure the host with (pyproject.toml).
_BENCH_EXTRA = frozenset({"simhash", "datasketch", "faiss", "psutil", "rensa", "matplotlib"})


def run_bench(name: str, options: Sequence[str], settings: Settings) -> int:
    """Run one benchmark module's ``main(options, settings)``, or every one for ``all``."""
    names = BENCHMARKS if name == "all" else (name,)
    status = 0
    for each in names:
        try:
            module = importlib.import_module(f".{each}", __package__)
            status = max(status, int(module.main(list(options), settings) or 0))
        except ModuleNotFoundError as exc:
            if exc.name not in _BENCH_EXTRA:
                raise
            raise SystemExit(
                f"streamdedup bench {each}: {exc.name} is not installed; the benchmarks need the bench extra "
                "(pip install 'streamdedup[bench]')"
            ) from exc
    return status
