"""Benchmarks: each runs streamdedup and the peers its issue names in the same run and prints ratios."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from ..settings import Settings

__all__ = ["BENCHMARKS", "run_bench"]

BENCHMARKS = ("fingerprint", "index", "kafka", "quality")


def run_bench(name: str, options: Sequence[str], settings: Settings) -> int:
    """Run one benchmark module's ``main(options, settings)``, or every one for ``all``."""
    names = BENCHMARKS if name == "all" else (name,)
    status = 0
    for each in names:
        module = importlib.import_module(f".{each}", __package__)
        status = max(status, int(module.main(list(options), settings) or 0))
    return status
