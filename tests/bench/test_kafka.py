from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from streamdedup.bench.kafka import _check_exit, main
from streamdedup.kafka.admin import admin_client
from streamdedup.settings import Settings, load_settings
from tests.bench.test_growth import _small_corpus


async def _topics(bootstrap: str) -> set[str]:
    """The broker's topics but its internal ones, which it creates on first use (offsets, transactions)."""
    async with admin_client(bootstrap_servers=bootstrap) as admin:
        return {topic for topic in await admin.list_topics() if not topic.startswith("__")}


def test_bench_reports_both_sides_and_deletes_its_topics(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING)
    before = asyncio.run(_topics(kafka_bootstrap))
    options = [
        "--messages",
        "1500",
        "--rate",
        "300",
        "--latency-seconds",
        "1",
        "--rounds",
        "2",
        "--bootstrap",
        kafka_bootstrap,
    ]
    assert main(options, Settings()) == 0
    out = capsys.readouterr().out
    throughput = re.search(r"throughput \(msg/s\)\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)", out)
    assert throughput, out
    passthrough, service, ratio = (float(group.replace(",", "")) for group in throughput.groups())
    assert passthrough > 0 and service > 0
    assert ratio == pytest.approx(service / passthrough, abs=0.006)
    # Each side's fastest of the rounds, all of which are printed.
    round_lines = re.findall(
        r"round \d: passthrough ([\d,]+) msg/s \(([\d,]+) at batch GC thresholds\), streamdedup ([\d,]+) msg/s, "
        r"ratio [\d.]+; host CPU steal (\d+ %|n/a) / (\d+ %|n/a)",
        out,
    )
    rounds = [[float(group.replace(",", "")) for group in found[:3]] for found in round_lines]
    assert len(rounds) == 2, out
    # The steal printed with the summary is that of the rounds that counted, side by side.
    fastest_passthrough = max(round_lines, key=lambda found: float(found[0].replace(",", "")))
    fastest_service = max(round_lines, key=lambda found: float(found[2].replace(",", "")))
    assert (
        f"in the rounds that counted: passthrough {fastest_passthrough[3]}, streamdedup {fastest_service[4]}" in out
    ), out
    assert passthrough == max(p for p, _, _ in rounds)
    assert service == max(s for _, _, s in rounds)
    # The reference passthrough, at the service's garbage collector thresholds, and the ratio to it.
    reference = re.search(r"batch GC thresholds ([\d,]+) msg/s; streamdedup / it ([\d.]+)", out)
    assert reference, out
    tuned, tuned_ratio = float(reference.group(1).replace(",", "")), float(reference.group(2))
    assert tuned == max(t for _, t, _ in rounds) and tuned_ratio == pytest.approx(service / tuned, abs=0.006)
    # CPU per message, each side's in all and by process, the local broker's included.
    per_round = re.findall(
        r"CPU per message ([\d.]+) us \(client ([\d.]+), broker ([\d.]+)\) / ([\d.]+) us \(service process ([\d.]+), "
        r"workers ([\d.]+), broker ([\d.]+)\)",
        out,
    )
    assert len(per_round) == 2, out
    for found in per_round:
        client_total, client, client_broker, service_total, loop, workers, service_broker = map(float, found)
        assert client > 0 and workers > 0 and loop > 0
        assert client_total == pytest.approx(client + client_broker, abs=0.11)
        assert service_total == pytest.approx(loop + workers + service_broker, abs=0.11)
    cpu = re.search(
        r"CPU per message \(us\)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\(median of the rounds, with the broker's\)", out
    )
    assert cpu, out
    client_cpu, service_cpu, cpu_ratio = map(float, cpu.groups())
    # The median of two rounds is their mean.
    assert client_cpu == pytest.approx(sum(float(found[0]) for found in per_round) / 2, abs=0.11)
    assert service_cpu == pytest.approx(sum(float(found[3]) for found in per_round) / 2, abs=0.11)
    assert cpu_ratio == pytest.approx(client_cpu / service_cpu, abs=0.006)
    assert re.search(r"latency p99 \(ms\)\s+\d+\.\d\s+\d+\.\d", out), out
    leftover = {topic for topic in asyncio.run(_topics(kafka_bootstrap)) - before if topic.startswith("bench-")}
    assert leftover == set()
    # Topics are created before any phase reads them, so no consumer meets a partition not yet served. (Other
    # errors aiokafka logs and retries, such as the group coordinator of a fresh broker not being up yet, are not
    # the bench's to prevent.)
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert [message for message in errors if "NotLeaderForPartition" in message] == []


def test_natural_text_through_the_service_reports_each_window(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus.jsonl"
    _small_corpus(corpus, 3_000)
    before = asyncio.run(_topics(kafka_bootstrap))
    options = ["--natural", "3000", "--window", "1000", "--corpus", str(corpus), "--bootstrap", kafka_bootstrap]
    # Ten batches a window: more than the service decides ahead of its commits, so each window decides some.
    assert main(options, load_settings(None, kafka={"batch_max_records": 100})) == 0
    out = capsys.readouterr().out
    windows = re.findall(
        r"^window +(\d+): +([\d,]+) msg/s, +([\d,]+) consumed, +([\d.]+) us/doc deciding$", out, re.MULTILINE
    )
    assert [int(number) for number, _, _, _ in windows] == list(range(1, len(windows) + 1))
    consumed = [int(count.replace(",", "")) for _, _, count, _ in windows]
    # Each window ends once 1,000 more are consumed (a batch may overshoot it), the last at the end (however many).
    assert consumed[-1] == 3000 and all(later - earlier >= 1000 for earlier, later in itertools.pairwise(consumed[:-1]))
    rates = [float(rate.replace(",", "")) for _, rate, _, _ in windows]
    assert all(rate > 0 for rate in rates)
    # The decision process's own time per record, in microseconds: more than nothing, and far less than the
    # 0.1 s a record that a mistaken unit or count would show (a window also holds batches decided ahead of its
    # commits, so the window's own time is no bound).
    deciding = [float(us) for _, _, _, us in windows]
    assert all(0 < us < 100_000 for us in deciding)
    ratio = re.search(r"^last window / first window msg/s: ([\d.]+)$", out, re.MULTILINE)
    assert ratio and float(ratio[1]) == pytest.approx(rates[-1] / rates[0], rel=0.01, abs=0.01)

    # Then the same documents as a steady stream, at 80 % of the backlog's mean rate (in hundreds).
    # (The rates printed are rounded: the mean from them may fall on the other side of a hundred.)
    windows_seconds = [
        (after - before) / rate for before, after, rate in zip([0, *consumed], consumed, rates, strict=False)
    ]
    mean = 3000 / sum(windows_seconds)
    steady_rate = re.search(r"^the same documents as a steady stream of ([\d,]+) msg/s", out, re.MULTILINE)
    assert steady_rate and int(steady_rate[1].replace(",", "")) % 100 == 0
    assert int(steady_rate[1].replace(",", "")) == pytest.approx(max(100, 0.8 * mean), abs=101)
    steady = re.findall(
        r"^steady window +(\d+): +([\d,]+) msg/s, +([\d,]+) consumed, lag median +([\d,]+), at most +([\d,]+) "
        r"records \(([\d.]+) s of input\), +([\d.]+) us/doc deciding, batches of ([\d,]+)$",
        out,
        re.MULTILINE,
    )
    assert [int(found[0]) for found in steady] == list(range(1, len(steady) + 1))
    steady_consumed = [int(found[2].replace(",", "")) for found in steady]
    assert steady_consumed[-1] == 3000 and all(
        later - earlier >= 1000 for earlier, later in itertools.pairwise(steady_consumed[:-1])
    )
    medians = [int(found[3].replace(",", "")) for found in steady]
    lags = [int(found[4].replace(",", "")) for found in steady]
    # Produced and not yet consumed: never more than the stream, and more than nothing at some moment (a
    # record is consumed only after it was produced, and each window's batches take milliseconds); a window's
    # median no more than its largest.
    assert all(0 <= lag <= 3000 for lag in lags) and max(lags) > 0
    assert all(0 <= median <= lag for median, lag in zip(medians, lags, strict=True))
    for found, lag in zip(steady, lags, strict=True):
        assert float(found[5]) == pytest.approx(lag / int(steady_rate[1].replace(",", "")), abs=0.006)
    # Batches of at most the 100 records a batch was limited to.
    assert all(1 <= int(found[7].replace(",", "")) <= 100 for found in steady)
    halves = re.search(
        r"^lag, first half of the stream / second half: median of the windows' medians ([\d,]+) / ([\d,]+) "
        r"records \(([\d.]+) / ([\d.]+) s of input\), largest ([\d,]+) / ([\d,]+) \(([\d.]+) / ([\d.]+) s\); "
        r"the last record consumed ([\d.]+) s after it was produced$",
        out,
        re.MULTILINE,
    )
    half = (len(lags) + 1) // 2
    assert halves
    figures = [int(halves[group].replace(",", "")) for group in (1, 2, 5, 6)]
    assert figures == [
        int(np.median(medians[:half])),
        int(np.median(medians[half:] or medians[-1:])),
        max(lags[:half]),
        max(lags[half:] or lags[-1:]),
    ]
    leftover = {topic for topic in asyncio.run(_topics(kafka_bootstrap)) - before if topic.startswith("bench-")}
    assert leftover == set()


def test_a_steady_producer_that_failed_ends_the_run_instead_of_leaving_it_waiting() -> None:
    context = multiprocessing.get_context("spawn")
    failed, finished = context.Process(target=sys.exit, args=(3,)), context.Process(target=sys.exit, args=(0,))
    for process in (failed, finished):
        process.start()
        process.join(30)
    with pytest.raises(RuntimeError, match="exited with 3"):
        _check_exit(failed, running=True)
    _check_exit(finished, running=True)
    _check_exit(finished, running=False)
    waiting = context.Process(target=time.sleep, args=(30,))
    waiting.start()
    try:
        _check_exit(waiting, running=True)  # still producing
        with pytest.raises(RuntimeError, match="exited with None"):
            _check_exit(waiting, running=False)
    finally:
        waiting.kill()
        waiting.join()
