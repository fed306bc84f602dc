"""``streamdedup bench kafka``: the service against a bare aiokafka passthrough, on the local broker, same run.

Both read the same 100k tweet-sized JSON messages with the same consumer settings and batch size and publish
in one Kafka transaction per batch with the input offsets, through the same record-batch sender (the
passthrough is transactional too, so the comparison isolates what the service adds: decoding,
fingerprinting, the index, headers). Throughput is measured on a backlog from the first consumed record to
the last commit, in ``--rounds`` rounds that alternate the passthrough and the service (each round with
fresh output topics, consumer groups and index); each side keeps its fastest round, as ``timeit`` keeps the
best of several, because one slow moment of a shared machine in one phase would otherwise decide the ratio.
Every round's figures are printed too, with the CPU time the host gave to other tenants while each side ran,
and the CPU time each side spent per message (its own processes and the local broker's): the passthrough waits on
the broker, the service keeps the cores busy, so the service's CPU per message is what sets its rate.
Latency is measured separately under a steady produce rate: output arrival time minus the time the message
was produced.

With ``--natural N``, the service alone instead runs a backlog of the first N documents of ``bench growth``'s
corpus (natural text: this machine's Debian package texts) and prints its rate per window of ``--window``
records consumed, the decision process's microseconds per record in each window, and the last window's rate
over the first's. Then the same documents arrive as a steady stream (``--steady-rate`` msg/s, by default 80 %
of the backlog's mean rate), produced by another process, into a fresh index: each window prints the median and
the largest lag seen (records produced and not yet consumed, sampled every 5 ms), and the run, for each half of
the stream, the median of the windows' medians and the largest lag. A service whose cost grew with its index would
fall further behind its input as it filled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import orjson
import psutil
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from ..garbage import collecting_for_batches
from ..kafka.admin import admin_client, ensure_topics, wait_for_group_coordinator
from ..kafka.consumer import committed_reader
from ..kafka.producer import send_batched
from ..kafka.records import OutgoingRecord
from ..metrics import Stage
from ..names import METRIC_PREFIX
from ..service import DedupService
from ..settings import Settings
from .growth_corpus import DEFAULT_CORPUS, ensure_corpus, read_corpus
from .host import CpuMeter, StealClock, bench_broker, describe_steal, local_broker

__all__ = ["main"]

_EPOCH = 1_700_000_000.0


def main(options: list[str], settings: Settings) -> int:
    parser = argparse.ArgumentParser(prog="streamdedup bench kafka", description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000, help="backlog size for throughput")
    parser.add_argument("--rate", type=int, default=2000, help="messages/s produced in the latency phase")
    parser.add_argument("--latency-seconds", type=float, default=10.0, help="length of the latency phase")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds; each side keeps its fastest")
    parser.add_argument("--bootstrap", default=None, help="use this broker instead of the local one")
    parser.add_argument("--natural", type=int, default=0, help="run the service alone over N natural documents")
    parser.add_argument("--window", type=int, default=50_000, help="records per window with --natural")
    parser.add_argument(
        "--steady-rate",
        type=int,
        default=0,
        help="msg/s of the steady stream with --natural (default: 80 %% of the backlog's mean rate)",
    )
    parser.add_argument(
        "--corpus", type=Path, default=DEFAULT_CORPUS, help="bench growth's corpus; assembled if missing"
    )
    args = parser.parse_args(options)

    with bench_broker(args.bootstrap) as bootstrap:
        if args.natural:
            return asyncio.run(_natural(settings, bootstrap, args.corpus, args.natural, args.window, args.steady_rate))
        return asyncio.run(_bench(settings, bootstrap, args))


async def _bench(settings: Settings, bootstrap: str, args: argparse.Namespace) -> int:
    texts = _tweets(args.messages, seed=1)
    batch = settings.kafka.batch_max_records
    print(
        f"broker {bootstrap}; {args.messages} messages of {np.mean([len(t) for t in texts]):.0f} chars on average; "
        f"batches of up to {batch} records, one transaction each (both sides)"
    )

    # Every topic of this run shares the prefix and is deleted at the end, with the index folder: a local
    # broker that keeps each run's 100k-message topics starts slower every time.
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        with tempfile.TemporaryDirectory(prefix="bench-kafka-") as work_dir:
            work = Path(work_dir)
            # Every topic up front: a topic whose leader was just elected can still refuse a consumer's first
            # offset lookup for a moment (aiokafka retries, but logs an ERROR), and by the time a phase starts,
            # its topics have long been served.
            round_names = [
                [f"{side}-out-{number}" for side in ("passthrough", "tuned", "service")]
                for number in range(1, args.rounds + 1)
            ]
            latency_names = ["latency-pass-in", "latency-pass-out", "latency-svc-in", "latency-svc-out"]
            names = ["input", *(name for outs in round_names for name in outs), *latency_names]
            topic = dict(zip(names, await _topics(bootstrap, prefix, *names), strict=True))
            input_topic = topic["input"]
            latency_in, lat_pass_out, latency_in2, lat_svc_out = (topic[name] for name in latency_names)
            await _produce(bootstrap, input_topic, [_value(t, _EPOCH + i) for i, t in enumerate(texts)])

            broker_process = local_broker(bootstrap)
            rounds: list[_Round] = []
            for number, outs in enumerate(round_names, start=1):
                pass_out, tuned_out, svc_out = (topic[name] for name in outs)
                steal = StealClock()
                passthrough, passthrough_cpu = await _passthrough_throughput(
                    settings, bootstrap, input_topic, pass_out, args.messages, broker_process
                )
                passthrough_steal = steal.percent()
                # Not the peer, a reference: the service collects garbage at batch thresholds (garbage.py), which
                # speeds up any loop handling thousands of records at once.
                with collecting_for_batches():
                    tuned, _ = await _passthrough_throughput(
                        settings, bootstrap, input_topic, tuned_out, args.messages, broker_process
                    )
                steal.restart()
                service, stages, service_cpu = await _service_throughput(
                    settings, bootstrap, input_topic, svc_out, args.messages, work / f"index-{number}", broker_process
                )
                service_steal = steal.percent()
                rounds.append(
                    _Round(
                        passthrough,
                        tuned,
                        service,
                        stages,
                        passthrough_steal,
                        service_steal,
                        passthrough_cpu,
                        service_cpu,
                    )
                )
                print(
                    f"round {number}: passthrough {passthrough:,.0f} msg/s ({tuned:,.0f} at batch GC thresholds), "
                    f"streamdedup {service:,.0f} msg/s, ratio {service / passthrough:.2f}; host CPU steal "
                    f"{describe_steal(passthrough_steal)} / {describe_steal(service_steal)}; CPU per message "
                    f"{_describe_cpu(passthrough_cpu, 'client', workers=False)} / "
                    f"{_describe_cpu(service_cpu, 'service process', workers=True)}",
                    flush=True,
                )

            pass_lat = await _latency(
                bootstrap,
                latency_in,
                lat_pass_out,
                args,
                lambda stop: _passthrough_loop(settings, bootstrap, latency_in, lat_pass_out, stop, None),
            )
            svc_lat = await _latency(
                bootstrap,
                latency_in2,
                lat_svc_out,
                args,
                lambda stop: _service_loop(settings, bootstrap, latency_in2, lat_svc_out, work / "index-latency", stop),
            )
    finally:
        await _delete_topics(bootstrap, prefix)

    passthrough_round = max(rounds, key=lambda each: each.passthrough)
    passthrough = passthrough_round.passthrough
    tuned = max(each.tuned for each in rounds)
    fastest = max(rounds, key=lambda each: each.service)
    service, stages = fastest.service, fastest.stages
    ratios = [each.service / each.passthrough for each in rounds]
    print()
    print(f"{'':28}{'passthrough':>14}{'streamdedup':>14}{'ratio':>9}")
    print(f"{'throughput (msg/s)':28}{passthrough:14,.0f}{service:14,.0f}{service / passthrough:9.2f}   (goal >= 0.50)")
    print(
        f"fastest of {len(rounds)} rounds each; per-round ratios "
        + ", ".join(f"{ratio:.2f}" for ratio in ratios)
        + f" (median {float(np.median(ratios)):.2f})"
    )
    print(
        f"reference: the passthrough at the service's batch GC thresholds {tuned:,.0f} msg/s; "
        f"streamdedup / it {service / tuned:.2f}"
    )
    print(
        f"host CPU steal (other tenants' share of the cores) in the rounds that counted: passthrough "
        f"{describe_steal(passthrough_round.passthrough_steal)}, streamdedup {describe_steal(fastest.service_steal)}"
    )
    passthrough_cpu_us = float(np.median([_total_cpu(each.passthrough_cpu) for each in rounds]))
    service_cpu_us = float(np.median([_total_cpu(each.service_cpu) for each in rounds]))
    broker = "with" if broker_process is not None else "without (not on this machine)"
    print(
        f"{'CPU per message (us)':28}{passthrough_cpu_us:14.1f}{service_cpu_us:14.1f}"
        f"{passthrough_cpu_us / service_cpu_us:9.2f}"
        f"   (median of the rounds, {broker} the broker's)"
    )
    for name, q in (("latency p50 (ms)", 50), ("latency p99 (ms)", 99)):
        a, b = np.percentile(pass_lat, q) * 1000, np.percentile(svc_lat, q) * 1000
        print(f"{name:28}{a:14.1f}{b:14.1f}{b / a:9.2f}")
    print(
        f"latency phase: {args.rate} msg/s for {args.latency_seconds:.0f} s; "
        f"{len(pass_lat)} / {len(svc_lat)} messages measured (the service publishes only novel ones)"
    )
    print(
        "service, mean ms per batch in its fastest throughput round: "
        + ", ".join(f"{stage} {1000 * seconds:.1f}" for stage, seconds in stages.items())
    )
    return 0


# ---------------------------------------------------------------------------------------------- natural text


async def _natural(
    settings: Settings, bootstrap: str, corpus: Path, documents: int, window: int, steady_rate: int
) -> int:
    ensure_corpus(corpus)
    lines, _, _ = read_corpus(corpus, documents)
    texts = [orjson.loads(line)["text"] for line in lines]
    print(
        f"broker {bootstrap}; {len(texts):,} documents of natural text ({corpus}), "
        f"{np.mean([len(t) for t in texts]):.0f} chars on average, as a backlog",
        flush=True,
    )
    values = [_value(t, _EPOCH + i) for i, t in enumerate(texts)]
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        with tempfile.TemporaryDirectory(prefix="bench-kafka-natural-") as work:
            source, sink, steady_source, steady_sink = await _topics(
                bootstrap, prefix, "natural-in", "natural-out", "steady-in", "steady-out"
            )
            await _produce(bootstrap, source, values)
            rates = await _windowed(settings, bootstrap, source, sink, len(texts), Path(work) / "index", window)
            for number, (consumed, rate, deciding) in enumerate(rates, start=1):
                print(
                    f"window {number:>3}: {rate:>8,.0f} msg/s, {consumed:>9,} consumed, "
                    f"{deciding:>5.1f} us/doc deciding"
                )
            print(f"last window / first window msg/s: {rates[-1][1] / rates[0][1]:.2f}", flush=True)

            befores = [0, *(consumed for consumed, _, _ in rates[:-1])]
            mean = len(texts) / sum(
                (consumed - before) / rate for (consumed, rate, _), before in zip(rates, befores, strict=True)
            )
            steady_rate = steady_rate or max(100, int(0.8 * mean) // 100 * 100)
            print(f"the same documents as a steady stream of {steady_rate:,} msg/s, into a fresh index", flush=True)
            windows, drain = await _steady(
                settings, bootstrap, steady_source, steady_sink, values, steady_rate, Path(work) / "steady", window
            )
    finally:
        await _delete_topics(bootstrap, prefix)
    for number, (consumed, rate, lag, median, deciding, batch) in enumerate(windows, start=1):
        print(
            f"steady window {number:>3}: {rate:>8,.0f} msg/s, {consumed:>9,} consumed, lag median {median:>6,}, "
            f"at most {lag:>7,} records ({lag / steady_rate:.2f} s of input), {deciding:>5.1f} us/doc deciding, "
            f"batches of {batch:,.0f}"
        )
    # By halves: one window's largest lag is one moment's (a merge, another process on the cores); its median is
    # what the stream waits most of the time.
    half = (len(windows) + 1) // 2
    halves = windows[:half], windows[half:] or windows[-1:]
    largest = [max(each.largest_lag for each in part) for part in halves]
    medians = [int(np.median([each.median_lag for each in part])) for part in halves]
    print(
        f"lag, first half of the stream / second half: median of the windows' medians {medians[0]:,} / "
        f"{medians[1]:,} records ({medians[0] / steady_rate:.2f} / {medians[1] / steady_rate:.2f} s of input), "
        f"largest {largest[0]:,} / {largest[1]:,} ({largest[0] / steady_rate:.2f} / {largest[1] / steady_rate:.2f} s); "
        f"the last record consumed {drain:.2f} s after it was produced"
    )
    return 0


class _SteadyWindow(NamedTuple):
    """A window of the steady stream: records consumed by its end, msg/s, the largest and the median lag seen,
    microseconds the decision process spent per record, and records per batch (one Kafka transaction each)."""

    consumed: int
    rate: float
    largest_lag: int
    median_lag: int
    deciding: float
    batch: float


async def _steady(
    settings: Settings,
    bootstrap: str,
    source: str,
    sink: str,
    values: list[bytes],
    rate: int,
    index: Path,
    window: int,
) -> tuple[list[_SteadyWindow], float]:
    """The service over ``values`` produced at ``rate`` msg/s by another process (so that producing does not
    share the service's event loop): a :class:`_SteadyWindow` at the end of each ``window`` records consumed, and
    the seconds from the last record produced to its consumption. The first record is produced alone, and the
    stream starts once it is consumed: the group has joined."""
    service = DedupService(_service_settings(settings, bootstrap, source, sink, index))
    deciding = f"{METRIC_PREFIX}{Stage.INDEX_LOOKUP.value}_duration_seconds_sum"
    context = multiprocessing.get_context("spawn")
    produced = context.Value("q", 0, lock=False)
    finished = context.Value("d", 0.0, lock=False)
    windows: list[_SteadyWindow] = []
    with collecting_for_batches():
        async with service, asyncio.timeout(3600):
            await _produce(bootstrap, source, values[:1])
            while service.stats.consumed < 1:
                await asyncio.sleep(0.01)
            producer = context.Process(
                target=_produce_steadily, args=(bootstrap, source, values[1:], rate, produced, finished)
            )
            producer.start()
            try:
                mark = (
                    time.perf_counter(),
                    service.stats.consumed,
                    service.metrics.registry.get_sample_value(deciding) or 0.0,
                    service.stats.transactions,
                )
                lags: list[int] = []
                while True:
                    # Counted together as each batch is published: a window's records and its transactions.
                    consumed, batches, now = service.stats.consumed, service.stats.transactions, time.perf_counter()
                    lags.append(produced.value + 1 - consumed)  # + the first record, produced alone
                    if consumed - mark[1] >= window or consumed >= len(values):
                        registry = service.metrics.registry
                        decided = registry.get_sample_value(deciding) or 0.0
                        records = consumed - mark[1]
                        windows.append(
                            _SteadyWindow(
                                consumed,
                                records / (now - mark[0]),
                                max(lags),
                                int(np.median(lags)),
                                (decided - mark[2]) / records * 1e6,
                                records / (batches - mark[3]),
                            )
                        )
                        mark, lags = (now, consumed, decided, batches), []
                    if consumed >= len(values):
                        break
                    _check_exit(producer, running=True)
                    await asyncio.sleep(0.005)
                consumed_at = time.time()
            finally:
                await asyncio.to_thread(producer.join, 30)
                if producer.is_alive():
                    producer.kill()
    _check_exit(producer, running=False)
    # The last record can be consumed before its producer has noted its acknowledgement.
    return windows, max(0.0, consumed_at - finished.value)


def _check_exit(producer: multiprocessing.process.BaseProcess, *, running: bool) -> None:
    """Raise if the producer process failed (or, once it should have ended, if it has not ended well): a stream
    that stopped short would leave the service waiting for records that never come."""
    if producer.exitcode not in ((None, 0) if running else (0,)):
        raise RuntimeError(f"the steady producer exited with {producer.exitcode}")


def _produce_steadily(bootstrap: str, topic: str, values: list[bytes], rate: int, produced: Any, finished: Any) -> None:
    """Produce ``values`` at ``rate`` msg/s, in record batches every few milliseconds, counting them in
    ``produced`` as they are acknowledged; ``finished`` is the wall-clock time the last one was."""

    async def stream() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, max_batch_size=1_048_576)
        await producer.start()
        try:
            started, sent = time.perf_counter(), 0
            while sent < len(values):
                due = min(len(values), int((time.perf_counter() - started) * rate) + 1)
                if due > sent:
                    records = [OutgoingRecord(topic, value, None, ()) for value in values[sent:due]]
                    await asyncio.gather(*await send_batched(producer, records, 1_048_576))
                    sent = due
                    produced.value = sent
                await asyncio.sleep(0.005)
            finished.value = time.time()
        finally:
            await producer.stop()

    asyncio.run(stream())


async def _windowed(
    settings: Settings, bootstrap: str, source: str, sink: str, n: int, index: Path, window: int
) -> list[tuple[int, float, float]]:
    """The service over a backlog of ``n`` records: (records consumed, msg/s, microseconds the decision process
    spent per record consumed) at the end of each ``window`` records, timed from the first record consumed. The
    decision process's time is its own metric (lookup and store), which the other stages' load on the cores
    does not hide."""
    service = DedupService(_service_settings(settings, bootstrap, source, sink, index))
    deciding = f"{METRIC_PREFIX}{Stage.INDEX_LOOKUP.value}_duration_seconds_sum"
    rates: list[tuple[int, float, float]] = []
    with collecting_for_batches():
        async with service, asyncio.timeout(3600):
            mark: tuple[float, int, float] | None = None
            while True:
                consumed, now = service.stats.consumed, time.perf_counter()
                decided = service.metrics.registry.get_sample_value(deciding) or 0.0
                if mark is None:
                    mark = (now, consumed, decided) if consumed else None
                elif consumed - mark[1] >= window or consumed >= n:
                    records = consumed - mark[1]
                    rates.append((consumed, records / (now - mark[0]), (decided - mark[2]) / records * 1e6))
                    mark = (now, consumed, decided)
                if consumed >= n:
                    return rates
                await asyncio.sleep(0.01)


# ---------------------------------------------------------------------------------------------- throughput


class _Round(NamedTuple):
    """One throughput round: msg/s of the passthrough, of the passthrough at batch GC thresholds (the
    reference) and of the service, the service's mean seconds per batch by stage, and the host's CPU steal
    in percent while the passthrough and while the service ran."""

    passthrough: float
    tuned: float
    service: float
    stages: dict[str, float]
    passthrough_steal: float | None
    service_steal: float | None
    passthrough_cpu: dict[str, float | None]
    service_cpu: dict[str, float | None]


def _describe_cpu(cpu: dict[str, float | None], process: str, *, workers: bool) -> str:
    """A side's microseconds of CPU per message: in all, and its parts (the broker's where it is known)."""
    parts = [(process, cpu["process"]), *([("workers", cpu["children"])] if workers else []), ("broker", cpu["broker"])]
    shown = ", ".join(f"{name} {value:.1f}" for name, value in parts if value is not None)
    return f"{_total_cpu(cpu):.1f} us ({shown})"


def _total_cpu(cpu: dict[str, float | None]) -> float:
    return sum(value for value in cpu.values() if value is not None)


async def _passthrough_throughput(
    settings: Settings, bootstrap: str, source: str, sink: str, n: int, broker: psutil.Process | None
) -> tuple[float, dict[str, float | None]]:
    """Messages/s, and the microseconds of CPU per message (see ``_Progress``)."""
    progress = _Progress(n, broker)
    progress.start_cpu()
    stop = asyncio.Event()
    task = asyncio.create_task(_passthrough_loop(settings, bootstrap, source, sink, stop, progress))
    try:
        async with asyncio.timeout(600):
            while progress.count < n:
                await asyncio.sleep(0.01)
    finally:
        stop.set()
        await task
    return progress.rate(), progress.cpu_per_message()


async def _service_throughput(
    settings: Settings, bootstrap: str, source: str, sink: str, n: int, index: Path, broker: psutil.Process | None
) -> tuple[float, dict[str, float], dict[str, float | None]]:
    """Messages/s, the mean seconds per batch of each stage the service times (from its own metrics), and the
    microseconds of CPU per message."""
    service = DedupService(_service_settings(settings, bootstrap, source, sink, index))
    progress = _Progress(n, broker)
    with collecting_for_batches():  # as ``streamdedup run`` does; the passthrough keeps Python's defaults
        async with service:
            progress.start_cpu()  # the workers started and warmed up: from here on, only records are processed
            async with asyncio.timeout(600):
                while service.stats.consumed < n:
                    progress.update(service.stats.consumed)
                    await asyncio.sleep(0.01)
            progress.update(service.stats.consumed)
    registry = service.metrics.registry
    stages = {}
    for stage in Stage:
        name = f"{METRIC_PREFIX}{stage.value}_duration_seconds"
        count = registry.get_sample_value(f"{name}_count") or 0.0
        stages[stage.value] = (registry.get_sample_value(f"{name}_sum") or 0.0) / count if count else 0.0
    return progress.rate(), stages, progress.cpu_per_message()


class _Progress:
    """Records consumed over time, from the first record seen to the last; and the CPU time spent by this
    process, its workers and the ``broker`` from ``start_cpu()`` (the clients started, before the first record)
    until ``target`` records were consumed, which counts every record's work whatever the side has in flight."""

    def __init__(self, target: int, broker: psutil.Process | None) -> None:
        self.count = 0
        self._target = target
        self._broker = broker
        self._first: tuple[float, int] | None = None
        self._last: tuple[float, int] | None = None
        self._meter: CpuMeter | None = None
        self._cpu: tuple[dict[str, float | None], int] | None = None

    def start_cpu(self) -> None:
        self._meter = CpuMeter(self._broker)

    def update(self, count: int) -> None:
        if count > self.count:
            now = time.perf_counter()
            if self._first is None:
                self._first = (now, count)
            self._last = (now, count)
            self.count = count
            if count >= self._target and self._cpu is None and self._meter is not None:
                self._cpu = (self._meter.seconds(), count)

    def cpu_per_message(self) -> dict[str, float | None]:
        """Microseconds of CPU per record consumed, by role (``CpuMeter``)."""
        assert self._cpu is not None
        seconds, messages = self._cpu
        return {role: None if value is None else 1e6 * value / messages for role, value in seconds.items()}

    def rate(self) -> float:
        assert self._first is not None and self._last is not None
        return (self._last[1] - self._first[1]) / max(self._last[0] - self._first[0], 1e-9)


async def _passthrough_loop(
    settings: Settings, bootstrap: str, source: str, sink: str, stop: asyncio.Event, progress: _Progress | None
) -> None:
    """Consume, produce the same records, commit offsets: one transaction per batch, nothing else."""
    kafka = settings.kafka
    group = f"bench-pass-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=group,
        enable_idempotence=True,
        acks="all",
        linger_ms=kafka.linger_ms,
        max_batch_size=min(1_048_576, kafka.max_request_bytes),
        max_request_size=kafka.max_request_bytes,
    )
    consumer = AIOKafkaConsumer(
        source,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        fetch_max_bytes=kafka.fetch_max_bytes,
    )
    async with admin_client(bootstrap_servers=bootstrap) as admin:
        await wait_for_group_coordinator(admin, group)
    await producer.start()
    await consumer.start()
    done = 0
    try:
        while not stop.is_set():
            fetched = await consumer.getmany(timeout_ms=kafka.batch_timeout_ms, max_records=kafka.batch_max_records)
            records = [r for tp in sorted(fetched) for r in fetched[tp]]
            if not records:
                continue
            async with producer.transaction():
                # Sent as the service sends its records (kafka/producer.py), so that both sides pay the same for it.
                outgoing = [OutgoingRecord(sink, r.value, r.key, tuple(r.headers)) for r in records]
                await asyncio.gather(*await send_batched(producer, outgoing, kafka.max_request_bytes))
                offsets = {tp: batch[-1].offset + 1 for tp, batch in fetched.items() if batch}
                await producer.send_offsets_to_transaction(offsets, group)
            done += len(records)
            if progress is not None:
                progress.update(done)
    finally:
        await consumer.stop()
        await producer.stop()


async def _service_loop(
    settings: Settings, bootstrap: str, source: str, sink: str, index: Path, stop: asyncio.Event
) -> None:
    with collecting_for_batches():
        async with DedupService(_service_settings(settings, bootstrap, source, sink, index)):
            await stop.wait()


def _service_settings(settings: Settings, bootstrap: str, source: str, sink: str, index: Path) -> Settings:
    unique = uuid.uuid4().hex[:8]
    kafka = settings.kafka.model_copy(
        update={
            "bootstrap_servers": bootstrap,
            "input_topics": [source],
            "output_topic": sink,
            "duplicates_topic": None,
            "dead_letter_topic": f"{sink}-dlq",
            "group_id": f"bench-svc-{unique}",
            "transactional_id": f"bench-svc-{unique}",
        }
    )
    return settings.model_copy(
        update={
            "kafka": kafka,
            "index": settings.index.model_copy(update={"path": index}),
            "metrics": settings.metrics.model_copy(update={"enabled": False}),
        }
    )


# ---------------------------------------------------------------------------------------------- latency


async def _latency(
    bootstrap: str,
    source: str,
    sink: str,
    args: argparse.Namespace,
    pipeline: Callable[[asyncio.Event], Coroutine[Any, Any, object]],
) -> np.ndarray:
    """Produce at a steady rate into ``source`` while ``pipeline`` runs; seconds from produce to ``sink``."""
    stop = asyncio.Event()
    runner = asyncio.create_task(pipeline(stop))
    reader_stop = asyncio.Event()
    latencies: list[float] = []
    reader = asyncio.create_task(_read_latencies(bootstrap, sink, latencies, reader_stop))
    try:
        await asyncio.sleep(3)  # group join and first fetch, outside the measurement
        texts = _tweets(int(args.rate * args.latency_seconds), seed=2)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
        await producer.start()
        try:
            started = time.perf_counter()
            for i, text in enumerate(texts):
                due = started + i / args.rate
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                await producer.send(source, _value(text, time.time()))
            await producer.flush()
        finally:
            await producer.stop()
        # Let the tail drain: until nothing has arrived for 3 s (a first group join on a new broker can take
        # longer than the whole phase, so wait for the first output too), within a minute.
        deadline, seen = time.monotonic() + 60, -1
        while (len(latencies) != seen or not latencies) and time.monotonic() < deadline:
            seen = len(latencies)
            await asyncio.sleep(3)
    finally:
        stop.set()
        await runner
        reader_stop.set()
        await reader
    if not latencies:
        raise RuntimeError(f"nothing arrived in {sink} during the latency phase")
    return np.array(latencies)


async def _read_latencies(bootstrap: str, topic: str, out: list[float], stop: asyncio.Event) -> None:
    async with committed_reader(bootstrap, topic) as (consumer, tp):
        while not stop.is_set():
            for record in (await consumer.getmany(tp, timeout_ms=50)).get(tp, []):
                out.append(time.time() - json.loads(record.value)["sent"])


# ---------------------------------------------------------------------------------------------- data


async def _topics(bootstrap: str, prefix: str, *names: str) -> list[str]:
    topics = [f"{prefix}-{name}" for name in names]
    async with admin_client(bootstrap_servers=bootstrap) as admin:
        await ensure_topics(admin, dict.fromkeys(topics, 1))
    return topics


async def _delete_topics(bootstrap: str, prefix: str) -> None:
    """Delete the run's topics, those the service created for it (dead letters) included."""
    async with admin_client(bootstrap_servers=bootstrap) as admin:
        doomed = [topic for topic in await admin.list_topics() if topic.startswith(f"{prefix}-")]
        if doomed:
            await admin.delete_topics(doomed)


async def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1_048_576)
    await producer.start()
    try:
        sent = [await producer.send(topic, value) for value in values]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def _value(text: str, sent: float) -> bytes:
    return json.dumps({"text": text, "sent": sent}).encode()


def _tweets(n: int, seed: int) -> list[str]:
    """Tweet-sized texts (10-25 words, ~140 chars); about 30% are lightly edited copies of earlier ones."""
    rng = random.Random(seed)
    vocabulary = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(20_000)
    ]
    texts: list[str] = []
    for _ in range(n):
        if texts and rng.random() < 0.3:
            words = rng.choice(texts).split()
            words[rng.randrange(len(words))] = rng.choice(vocabulary)
            texts.append(" ".join(words))
        else:
            texts.append(" ".join(rng.choices(vocabulary, k=rng.randint(10, 25))))
    return texts
