"""``streamdedup bench scale``: a scaled-out deployment (``kafka.sequence_topic``) of 1, 2 and 3 instances on the
local broker, and its fail-over.

Each instance count runs a fresh deployment (topics, groups, index folders) over the same documents, after one
instance without a sequence topic (the default configuration, for reference): the first
``--documents`` of ``bench growth``'s corpus (natural text), produced on an input topic of ``--partitions``
partitions once every instance holds its roles. The instances are ``streamdedup run`` processes with the given
settings and the deployment's names. For each count it prints documents/s from the first document out to the
last, and for each instance, by role, the CPU microseconds per document its processes spent from the first
document produced to the last out: the event loop (consume, sequence, and the decider's publish), the signing
workers (sign), the decision process (decide, or follow as the standby); and the broker's. The decision process
bounds the deployment: one decides everything, and the standby stores what it kept.

The sequence topic of the largest deployment then goes through the decision step alone: one decision core in the
bench's process, from an empty index, deciding the sequence records as a decider behind its input decides them
(fetched as its consumer fetches, ``MOST_BATCHES_TOGETHER`` fetches in one call, with the signatures the
sequencers made), three times over, each from an empty index. It prints the CPU microseconds per document of
those calls in each run and the documents/s the fastest makes on one core: the bound of the one sequential step,
which the deployments above, paced by their input on shared cores, do not reach.

Then the fail-over: two instances run ``--failover-documents`` distinct documents (an index of as many entries)
and the standby follows the decider. The standby is stopped, its index deleted, and it is started again: the
seconds until it logs that its index is level with the decider's are the time to rebuild an index from Kafka.
Then the decider is killed (SIGKILL) and the seconds until a document produced at that moment comes out are
measured: the decider group's session timeout, the takeover, and what is left to replay.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import orjson
import psutil
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from ..decide import Deduplicator, open_index
from ..decision_process import MOST_BATCHES_TOGETHER
from ..document import Document, DocumentDecoder
from ..kafka.admin import admin_client, ensure_topics
from ..kafka.consumer import partition_fetch_bytes
from ..kafka.producer import send_batched
from ..kafka.records import OutgoingRecord, decoded_records
from ..names import METRIC_PREFIX, verdicts_topic
from ..service.origins import Origins
from ..settings import Settings
from ..signature import signing_id
from .growth_corpus import DEFAULT_CORPUS, ensure_corpus, read_corpus
from .host import StealClock, bench_broker, describe_steal, local_broker

__all__ = ["main"]

_STAGES = ("event loop", "signing workers", "decision process")
_ROLES = ("single", "decider", "standby", "sequencer")
_STARTUP_SECONDS = 180.0
_REBUILD_SECONDS = 600.0
# How a standby's log line says that its index has caught up with the decider's.
_LEVEL = '"message": "level with the decider'
# A deployment that puts out nothing for this long is stuck: the bench says so rather than wait for ever.
_WAIT_OUT_SECONDS = 1800.0
_DECISION_RUNS = 3
"""Runs of the decision step alone, each from an empty index: the fastest is its bound (on a shared machine the
others met other work)."""


def main(options: list[str], settings: Settings) -> int:
    parser = argparse.ArgumentParser(prog="streamdedup bench scale", description=__doc__)
    parser.add_argument("--documents", type=int, default=200_000, help="natural documents per instance count")
    parser.add_argument("--instances", default="1,2,3", help="instance counts to run, comma-separated")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the input topic")
    parser.add_argument("--failover-documents", type=int, default=1_000_000, help="0: no fail-over phase")
    parser.add_argument("--bootstrap", default=None, help="use this broker instead of the local one")
    parser.add_argument(
        "--corpus", type=Path, default=DEFAULT_CORPUS, help="bench growth's corpus; assembled if missing"
    )
    args = parser.parse_args(options)
    with bench_broker(args.bootstrap) as bootstrap:
        return asyncio.run(_bench(settings, bootstrap, args))


async def _bench(settings: Settings, bootstrap: str, args: argparse.Namespace) -> int:
    ensure_corpus(args.corpus)
    lines, _, _ = read_corpus(args.corpus, args.documents)
    values = [orjson.dumps({"text": orjson.loads(line)["text"]}) for line in lines]
    counts = [int(count) for count in args.instances.split(",")]
    print(
        f"broker {bootstrap}; {len(values):,} natural documents ({args.corpus}) on {args.partitions} partitions; "
        f"{psutil.cpu_count()} cores on this machine, shared by the instances and the broker",
        flush=True,
    )
    broker = local_broker(bootstrap)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as work:
        print(
            "CPU us per document of the backlog, by instance and process: the event loop consumes, sequences and "
            "(the decider's) publishes; the signing workers sign; the decision process decides (the decider) or "
            "follows (the standby)"
        )
        print("| instances | docs/s | instance | " + " | ".join(f"{stage} us/doc" for stage in _STAGES) + " |")
        print("|---|---|---|" + "---|" * len(_STAGES))
        # The reference first, in the same run: one instance without a sequence topic.
        for count, scaled_out in [(1, False), *((count, True) for count in counts)]:
            steal = StealClock()
            source = f"bench-scale-{uuid.uuid4().hex[:8]}"
            await _create(bootstrap, {source: args.partitions})
            deployment = _Deployment(settings, bootstrap, Path(work) / f"n{count}-{scaled_out}", source, scaled_out)
            out, cpu = await deployment.backlog([f"i{n}" for n in range(count)], values, broker)
            rate = len(values) / max(out.last - out.first, 1e-9)
            label = str(count) if scaled_out else "1, no sequence topic"
            for number, (role, seconds) in enumerate(sorted(cpu.items(), key=lambda item: _ROLES.index(item[0][0]))):
                per_doc = " | ".join(f"{1e6 * seconds[stage] / len(values):,.1f}" for stage in _STAGES)
                first = f"| {label} | {rate:,.0f} |" if number == 0 else "| | |"
                print(f"{first} {role[1]} ({role[0]}) | {per_doc} |")
            broker_cpu = deployment.broker_seconds
            print(
                f"|   |   | broker: {1e6 * broker_cpu / len(values):,.1f} us/doc; steal "
                f"{describe_steal(steal.percent())} | | | |"
            )
            if scaled_out and count == counts[-1]:
                # Alone on the machine: the instances would share its cores and caches.
                await deployment.stop()
                await _decision_step(
                    settings, bootstrap, deployment.topics["seq"], Path(work) / "decision-step", out.kept
                )
            await deployment.delete()
            await _delete(bootstrap, [source])
        if args.failover_documents:
            await _failover(settings, bootstrap, Path(work) / "failover", args.failover_documents, args.partitions)
    return 0


async def _decision_step(settings: Settings, bootstrap: str, topic: str, work: Path, published: int) -> None:
    """Decide the sequence topic's records again, from an empty index, in this process (see the module
    docstring); print the CPU per document of the decision calls, and the documents kept beside the
    deployment's ``published``."""
    tp = TopicPartition(topic, 0)
    # Fetched as the decider's consumer fetches: its batches are these fetches.
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        fetch_max_bytes=settings.kafka.fetch_max_bytes,
        max_partition_fetch_bytes=partition_fetch_bytes(settings.input.max_message_bytes),
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        batches: list[list[ConsumerRecord]] = []
        while await consumer.position(tp) < end:
            fetched = await consumer.getmany(tp, timeout_ms=1000, max_records=settings.kafka.batch_max_records)
            if fetched.get(tp):
                batches.append(fetched[tp])
    finally:
        await consumer.stop()
    origins, decoder, signing = (
        Origins(sequenced=True),
        DocumentDecoder(settings.input),
        signing_id(settings.fingerprint, settings.dedup),
    )
    decoded_batches = []
    for start in range(0, len(batches), MOST_BATCHES_TOGETHER):
        records = [record for batch in batches[start : start + MOST_BATCHES_TOGETHER] for record in batch]
        carried = origins.carried(records)
        decoded = decoded_records(decoder, carried.records, carried.origins)
        rows = [row for row, item in enumerate(decoded) if isinstance(item, Document)]
        signatures = carried.signatures(rows, signing)
        if signatures is None:
            raise RuntimeError("the sequence topic holds records the sequencers did not sign as configured")
        docs = [item for item in decoded if isinstance(item, Document)]
        decoded_batches.append((docs, signatures, {(topic, 0): origins.index_offset(records[-1].offset + 1)}))
    documents, calls = sum(len(docs) for docs, _, _ in decoded_batches), len(decoded_batches)
    runs = []
    for run in range(_DECISION_RUNS):
        index = open_index(settings, work / f"index-{run}")
        try:
            dedup, seconds, kept = Deduplicator(settings, index), 0.0, 0
            for docs, signatures, offsets in decoded_batches:
                started = time.process_time()
                verdicts = dedup.decide(docs, signatures=signatures, source_offsets=offsets)
                seconds += time.process_time() - started
                kept += int(verdicts.novel.sum())
        finally:
            index.close()
        runs.append(seconds)
    seconds = min(runs)
    each = " / ".join(f"{1e6 * run / max(documents, 1):.1f}" for run in runs)
    print(
        f"decision step alone: {documents:,} documents ({sum(map(len, batches)):,} sequence records in "
        f"{len(batches):,} fetches) decided again from an empty index in {calls:,} calls of up to "
        f"{MOST_BATCHES_TOGETHER} fetches "
        f"({documents / max(calls, 1):,.0f} documents a call), the fastest of {_DECISION_RUNS} runs ({each} us): "
        f"{1e6 * seconds / max(documents, 1):.1f} us of CPU "
        f"a document, {documents / max(seconds, 1e-9):,.0f} documents/s on one core; {kept:,} kept (the deployment "
        f"published {published:,})"
    )


async def _failover(settings: Settings, bootstrap: str, work: Path, documents: int, partitions: int) -> None:
    source = f"bench-failover-{uuid.uuid4().hex[:8]}"
    await _create(bootstrap, {source: partitions})
    rng = random.Random(0)
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    texts = [" ".join("".join(rng.choices(alphabet, k=rng.randint(3, 9))) for _ in range(20)) for _ in range(documents)]
    deployment = _Deployment(settings, bootstrap, work, source, scaled_out=True)
    try:
        kept = (await deployment.backlog(["a", "b"], [orjson.dumps({"text": text}) for text in texts], None))[0].kept
        decider = deployment.decider()
        if decider is None:
            raise RuntimeError("no instance decides")
        standby = next(name for name in deployment.instances if name != decider)
        await deployment.when_level(standby)
        rebuilt = await deployment.rebuilt(standby)
        print(
            f"rebuild from Kafka: the standby's index deleted and the standby restarted, level with the decider's "
            f"{kept:,} entries {rebuilt:.1f} s later ({kept / rebuilt:,.0f} entries/s)",
            flush=True,
        )
        await deployment.when_level(standby)
        ends = await deployment.ends()
        killed = time.perf_counter()
        deployment.instances[decider].process.send_signal(signal.SIGKILL)
        await _produce(bootstrap, source, [orjson.dumps({"text": "a document produced as the decider died"})])
        await deployment.wait_out(1, ends)
        seconds = time.perf_counter() - killed
        session = settings.kafka.session_timeout_ms / 1000
        print(
            f"fail-over: {seconds:.1f} s from SIGKILL of the decider to the next document out, the standby's index "
            f"holding {kept:,} entries (kafka.session_timeout_ms: {session:.0f} s of it)"
        )
    finally:
        await deployment.delete()
        await _delete(bootstrap, [source])


class _Out(NamedTuple):
    first: float
    last: float
    kept: int


@dataclass
class _Instance:
    process: subprocess.Popen[bytes]
    log: Path
    port: int

    def pids(self) -> dict[str, list[int]]:
        """The instance's processes by stage: its event loop, its signing workers (their pids are logged when
        they are ready) and its decision process (the other child)."""
        main = psutil.Process(self.process.pid)
        workers: list[int] = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{") and "signing workers ready" in line:
                workers = json.loads(line).get("pids", [])
        children = [child.pid for child in main.children(recursive=True)]
        return {
            "event loop": [main.pid],
            "signing workers": [pid for pid in children if pid in workers],
            "decision process": [pid for pid in children if pid not in workers],
        }

    def cpu(self) -> dict[str, float]:
        """CPU seconds (user and system) each of the instance's processes spent so far, by stage."""
        return {stage: sum(_seconds(psutil.Process(pid)) for pid in pids) for stage, pids in self.pids().items()}

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(f"{METRIC_PREFIX}{name} "):
                    return float(line.split()[1])
        raise KeyError(name)


@dataclass
class _Deployment:
    settings: Settings
    bootstrap: str
    work: Path
    source: str
    # False: the single instance of the default configuration (no sequence topic), for reference.
    scaled_out: bool
    unique: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    instances: dict[str, _Instance] = field(default_factory=dict)
    broker_seconds: float = 0.0

    @property
    def topics(self) -> dict[str, str]:
        return {role: f"bench-scale-{self.unique}-{role}" for role in ("out", "dup", "dlq", "seq")}

    def start(self, name: str) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        config = self.settings.model_dump(mode="json")
        topics = self.topics
        config["kafka"].update(
            bootstrap_servers=self.bootstrap,
            input_topics=[self.source],
            output_topic=topics["out"],
            duplicates_topic=topics["dup"],
            dead_letter_topic=topics["dlq"],
            sequence_topic=topics["seq"] if self.scaled_out else None,
            group_id=f"bench-scale-{self.unique}",
            group_instance_id=name,
            transactional_id=None,
        )
        config["index"]["path"] = str(self.work / f"index-{name}")
        port = _free_port()
        config["metrics"].update(enabled=True, host="127.0.0.1", port=port)
        config["logging"] = {"level": "INFO", "format": "json"}
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        log = self.work / f"{name}.log"
        with log.open("ab") as out:
            command = [sys.executable, "-c", "from streamdedup.cli import main; main()", "--config", str(path), "run"]
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        self.instances[name] = _Instance(process, log, port)

    async def backlog(
        self, names: Sequence[str], values: list[bytes], broker: psutil.Process | None
    ) -> tuple[_Out, dict[tuple[str, str], dict[str, float]]]:
        """Start the instances, and once each holds its roles, produce ``values`` and run them through: when the
        first and the last document came out, and the CPU seconds each instance's processes spent in between, by
        (role, instance). The broker's goes to ``broker_seconds``."""
        await _create(self.bootstrap, {tp.topic: 1 for tp in self._outputs()})
        for name in names:
            self.start(name)
        deadline = time.monotonic() + _STARTUP_SECONDS
        while not self._settled(names):
            if time.monotonic() > deadline:
                raise TimeoutError("the instances did not take their roles")
            await asyncio.sleep(0.5)
        # CPU from here: the instances stand idle until the backlog arrives.
        before = {name: instance.cpu() for name, instance in self.instances.items()}
        broker_before = _seconds(broker)
        producing = asyncio.create_task(_produce(self.bootstrap, self.source, values))
        out = await self.wait_out(len(values))
        await producing
        after = {name: instance.cpu() for name, instance in self.instances.items()}
        self.broker_seconds = _seconds(broker) - broker_before
        cpu = {
            (self.role(name), name): {stage: after[name][stage] - before[name][stage] for stage in _STAGES}
            for name in names
        }
        return out, cpu

    def _settled(self, names: Sequence[str]) -> bool:
        """Every instance sequences some input, one decides and (with more than one) one follows it; without a
        sequence topic, the instance owns the input."""
        logs = [self.instances[name].log.read_text() for name in names]
        if not self.scaled_out:
            return all("owning all" in text for text in logs)
        sequencing = all("sequencing " in text for text in logs)
        following = len(names) == 1 or any("following the decider" in text for text in logs)
        return sequencing and following and self.decider() is not None

    def role(self, name: str) -> str:
        """The instance's role at the end: decider, standby (it follows the decider) or sequencer; ``single``
        without a sequence topic."""
        if not self.scaled_out:
            return "single"
        if name == self.decider():
            return "decider"
        text = self.instances[name].log.read_text()
        following = text.rfind('"message": "following the decider"') > text.rfind('"message": "no longer following')
        return "standby" if following else "sequencer"

    def decider(self) -> str | None:
        latest: tuple[str, str] | None = None
        for name, instance in self.instances.items():
            for line in instance.log.read_text().splitlines():
                if line.startswith("{") and "deciding the sequence topic" in line:
                    stamp = json.loads(line)["time"]
                    if latest is None or stamp > latest[0]:
                        latest = (stamp, name)
        return None if latest is None else latest[1]

    async def when_level(self, standby: str) -> None:
        """Wait until the standby has followed everything."""
        instance = self.instances[standby]
        while instance.metric("standby_lag_records") > 0 or "following the decider" not in instance.log.read_text():
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.0)

    async def rebuilt(self, name: str) -> float:
        """Stop the instance, delete its index and start it again: the seconds until it logs that its index is
        level with the decider's."""
        instance = self.instances.pop(name)
        instance.process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(instance.process.wait, 60)
        shutil.rmtree(self.work / f"index-{name}")
        levelled = instance.log.read_text().count(_LEVEL)
        started = time.perf_counter()
        self.start(name)
        while instance.log.read_text().count(_LEVEL) <= levelled:
            if time.perf_counter() - started > _REBUILD_SECONDS:
                raise TimeoutError(f"{name} did not rebuild its index in {_REBUILD_SECONDS} s")
            await asyncio.sleep(0.2)
        return time.perf_counter() - started

    def _outputs(self) -> list[TopicPartition]:
        return [TopicPartition(self.topics[role], 0) for role in ("out", "dup", "dlq")]

    async def ends(self) -> dict[TopicPartition, int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, isolation_level="read_committed")
        await consumer.start()
        try:
            return dict(await consumer.end_offsets(self._outputs()))
        finally:
            await consumer.stop()

    async def wait_out(self, documents: int, after: dict[TopicPartition, int] | None = None) -> _Out:
        """Read the output topics (from ``after``, else the start) until ``documents`` came out: when the first
        and the last did, and how many went to the output topic."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, isolation_level="read_committed")
        await consumer.start()
        try:
            partitions = self._outputs()
            consumer.assign(partitions)
            if after is None:
                await consumer.seek_to_beginning(*partitions)
            else:
                for tp, offset in after.items():
                    consumer.seek(tp, offset)
            seen, kept, first, last = 0, 0, 0.0, 0.0
            deadline = time.monotonic() + _WAIT_OUT_SECONDS
            while seen < documents:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{seen:,} of {documents:,} documents came out")
                for tp, records in (await consumer.getmany(timeout_ms=500, max_records=100_000)).items():
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    seen += len(records)
                    kept += len(records) if tp.topic == self.topics["out"] else 0
            return _Out(first, last, kept)
        finally:
            await consumer.stop()

    async def stop(self) -> None:
        """Stop the instances (SIGTERM, then wait for each); idempotent."""
        for instance in self.instances.values():
            if instance.process.poll() is None:
                instance.process.send_signal(signal.SIGTERM)
        for instance in self.instances.values():
            await asyncio.to_thread(instance.process.wait, 60)

    async def delete(self) -> None:
        await self.stop()
        topics = self.topics
        verdicts = [verdicts_topic(topics["seq"])] if self.scaled_out else []
        await _delete(self.bootstrap, [*topics.values(), *verdicts])


def _seconds(process: psutil.Process | None) -> float:
    if process is None:
        return 0.0
    times = process.cpu_times()
    return float(times.user + times.system)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _create(bootstrap: str, topics: dict[str, int]) -> None:
    async with admin_client(bootstrap_servers=bootstrap) as admin:
        await ensure_topics(admin, topics)


async def _delete(bootstrap: str, topics: list[str]) -> None:
    async with admin_client(bootstrap_servers=bootstrap) as admin:
        existing = set(await admin.list_topics())
        doomed = [topic for topic in topics if topic in existing]
        if doomed:
            await admin.delete_topics(doomed)


async def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """Record batches keyed by position, so that the values spread over the partitions, sent as fast as the
    service's own producer sends."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1_048_576)
    await producer.start()
    try:
        for start in range(0, len(values), 50_000):
            records = [
                OutgoingRecord(topic, value, str(start + i).encode(), ())
                for i, value in enumerate(values[start : start + 50_000])
            ]
            await asyncio.gather(*await send_batched(producer, records, 1_048_576))
    finally:
        await producer.stop()
