"""``streamdedup bench scale`` on the real broker, small: every instance count reports its rate and each instance's
CPU by process and role, the decision step alone is timed over the sequence topic, the fail-over is timed, and the
bench removes what it made."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from streamdedup.bench.scale import main
from streamdedup.settings import Settings
from tests.bench.test_growth import _small_corpus
from tests.bench.test_kafka import _topics

pytestmark = pytest.mark.integration


def test_each_instance_count_reports_its_rate_and_each_instances_cpu_and_the_fail_over_is_timed(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    _small_corpus(corpus, 3_000)
    before = asyncio.run(_topics(kafka_bootstrap))
    # One signing worker an instance: six processes on the test machine's cores, not eight.
    settings = Settings(dedup={"workers": 1}, kafka={"session_timeout_ms": 6000})
    options = ["--documents", "3000", "--instances", "1,2", "--failover-documents", "2000"]
    assert main([*options, "--corpus", str(corpus), "--bootstrap", kafka_bootstrap], settings) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (\d+) \| ([\d,]+) \| (\w+) \((\w+)\) \| ([\d.,]+) \| ([\d.,]+) \| ([\d.,]+) \|$", out, re.M)
    assert [(count, role) for count, _, _, role, *_ in rows] == [("1", "decider"), ("2", "decider")], out
    assert all(float(rate.replace(",", "")) > 0 for _, rate, *_ in rows)
    # The single instance sequences, signs and decides everything; with two, the other one follows or sequences.
    assert all(
        float(cpu.replace(",", "")) > 0 for *_, loop, sign, decide in rows[:1] for cpu in (loop, sign, decide)
    ), out
    # The reference in the same run: one instance without a sequence topic.
    assert re.search(r"^\| 1, no sequence topic \| [\d,]+ \| i0 \(single\) \|", out, re.M), out
    others = re.findall(r"^\| \| \| (\w+) \((standby|sequencer)\) \|", out, re.M)
    assert len(others) == 1, out
    # The decision step alone, over the largest deployment's sequence topic: every document, the same kept.
    step = re.search(
        r"decision step alone: ([\d,]+) documents \(([\d,]+) sequence records in [\d,]+ fetches\) .* calls of "
        r"up to 8 fetches .*: ([\d.]+) us of CPU a document, ([\d,]+) documents/s on one core; ([\d,]+) kept \(the "
        r"deployment published ([\d,]+)\)",
        out,
    )
    assert step, out
    assert step.group(1) == "3,000" and int(step.group(2)) >= 1
    assert float(step.group(3)) > 0 and int(step.group(4).replace(",", "")) > 0
    assert step.group(5) == step.group(6) != "0"
    rebuild = re.search(r"rebuild from Kafka: .* level with the decider's ([\d,]+) entries ([\d.]+) s later", out)
    assert rebuild, out
    assert 0 < int(rebuild.group(1).replace(",", "")) <= 2000 and float(rebuild.group(2)) > 0
    failover = re.search(r"fail-over: ([\d.]+) s from SIGKILL of the decider .* holding ([\d,]+) entries", out)
    assert failover, out
    assert 0.0 < float(failover.group(1)) < 60.0
    assert 0 < int(failover.group(2).replace(",", "")) <= 2000
    assert asyncio.run(_topics(kafka_bootstrap)) - before == set()
