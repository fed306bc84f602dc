from __future__ import annotations

import re

import pytest

from streamdedup.bench.index import Timing, main
from streamdedup.settings import Settings


def test_the_fastest_round_is_the_one_of_least_wall_time() -> None:
    rounds = [Timing([0.3, 0.2], 0.5), Timing([0.1, 0.3], 0.9), Timing([0.2, 0.3], 0.4)]
    fastest = Timing.never()
    for timing in rounds:
        fastest = min(fastest, timing)
    assert fastest is rounds[1]


def test_a_small_bench_finds_what_faiss_finds_and_prints_every_ratio(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            "--entries",
            "20000",
            "--queries",
            "4096",
            "--simhash-queries",
            "200",
            "--rounds",
            "2",
            "--no-sync",
            "--dir",
            str(tmp_path),
        ],
        Settings(),
    )
    out = capsys.readouterr().out
    ours, faiss = _matches(out)
    # Half the queries are near copies of stored fingerprints: each finds at least its original.
    assert ours == faiss >= 2048
    assert status == 0
    for measure in ("search / faiss", "search / simhash"):
        assert re.search(rf"ratio {measure} \(goal >= [\d.]+\) \| [\d.]+ wall, [\d.]+ CPU", out)
    assert "fastest of 2 rounds" in out
    assert list(tmp_path.iterdir()) == []


def _matches(out: str) -> tuple[int, int]:
    found = re.search(r"matches ours / faiss \(must be equal\) \| ([\d,]+) / ([\d,]+)", out)
    assert found is not None
    return int(found[1].replace(",", "")), int(found[2].replace(",", ""))
