"""A scaled-out deployment (``kafka.sequence_topic``) on the real broker, each instance a ``streamdedup run``
process: near-copies spread over partitions and instances are decided as one decision core decides the sequence
topic's order, every input record comes out exactly once, and neither kill -9, a freeze, a lost index nor a broker
restart changes the output."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import signal
import subprocess
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord
from prometheus_client.parser import text_string_to_metric_families

from streamdedup.decide import Deduplicator, open_index
from streamdedup.document import Document, DocumentDecoder
from streamdedup.kafka.admin import admin_client, ensure_topics, partition_counts
from streamdedup.kafka.broker import LocalBroker
from streamdedup.kafka.records import decoded_records
from streamdedup.kafka.verdict_records import BatchVerdicts
from streamdedup.names import verdicts_topic
from streamdedup.quality.natural import load_natural
from streamdedup.service.origins import Origins
from streamdedup.service.sequencer import prepare_sequence_topic
from streamdedup.settings import ConfigError, Settings, load_settings
from tests.conftest import OutRecord, consume_records, free_port, process_state, produce_records
from tests.test_service import Topics, start_service, wait_for, write_config

pytestmark = pytest.mark.integration

_PARTITIONS = 6
# The broker's smallest session timeout: a member that died or froze leaves the group after this.
_SESSION_MS = 6000
_TRANSACTION_MS = 10_000


@dataclass
class Deployment:
    """Instances of one scaled-out deployment: the same settings but for ``group_instance_id`` and
    ``index.path``."""

    bootstrap: str
    topics: Topics
    root: Path
    unique: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    # Signing workers per instance (none: the sequencer signs in a thread, the decider's process keys).
    workers: int = 0
    # Other dedup settings of every instance.
    dedup: dict[str, Any] = field(default_factory=dict)
    # The instances that serve /metrics, on these ports (the others serve none).
    metrics_ports: dict[str, int] = field(default_factory=dict)

    @property
    def sequence_topic(self) -> str:
        return f"seq-{self.unique}"

    def settings(self, name: str) -> dict[str, Any]:
        return {
            "kafka": {
                "bootstrap_servers": self.bootstrap,
                "input_topics": [self.topics.input],
                "output_topic": self.topics.output,
                "duplicates_topic": self.topics.duplicates,
                "dead_letter_topic": self.topics.dead_letters,
                "group_id": f"group-{self.unique}",
                "group_instance_id": name,
                "sequence_topic": self.sequence_topic,
                "session_timeout_ms": _SESSION_MS,
                "heartbeat_interval_ms": 1000,
                "transaction_timeout_ms": _TRANSACTION_MS,
                "batch_timeout_ms": 50,
                "batch_max_records": 200,
            },
            "index": {"path": str(self.index_path(name)), "expected_entries": 100_000, "max_age_seconds": None},
            "input": {"id_field": "id"},
            "metrics": {
                "enabled": name in self.metrics_ports,
                "host": "127.0.0.1",
                "port": self.metrics_ports.get(name, 0),
            },
            "dedup": {"workers": self.workers, **self.dedup},
            "logging": {"format": "json"},
        }

    def index_path(self, name: str) -> Path:
        return self.root / f"index-{name}"

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    def start(self, name: str) -> None:
        config = write_config(self.root / f"{name}.yaml", self.settings(name))
        self.processes[name] = start_service(config, self.log(name))

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        process.kill()
        process.wait(30)

    def stop(self, name: str) -> int:
        process = self.processes.pop(name)
        process.send_signal(signal.SIGCONT)
        process.send_signal(signal.SIGTERM)
        return process.wait(60)

    def stop_all(self) -> dict[str, int]:
        return {name: self.stop(name) for name in list(self.processes)}

    async def gauge(self, name: str, metric: str) -> float:
        """The value of an unlabelled gauge on an instance's /metrics."""
        url = f"http://127.0.0.1:{self.metrics_ports[name]}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == metric and not sample.labels:
                    return float(sample.value)
        raise AssertionError(f"{metric} is not on {name}'s /metrics")

    def decider(self) -> str | None:
        """The instance that logged last that it decides (JSON logs: the newest line wins)."""
        latest: tuple[str, str] | None = None
        for name in self.processes:
            for line in self.log(name).read_text().splitlines():
                if line.startswith("{") and "deciding the sequence topic" in line:
                    stamp = json.loads(line)["time"]
                    if latest is None or stamp > latest[0]:
                        latest = (stamp, name)
        return None if latest is None else latest[1]

    async def results(self) -> tuple[list[ConsumerRecord], list[ConsumerRecord], list[ConsumerRecord]]:
        return (
            await consume_records(self.bootstrap, self.topics.output),
            await consume_records(self.bootstrap, self.topics.duplicates),
            await consume_records(self.bootstrap, self.topics.dead_letters),
        )

    async def produce(self, records: list[OutRecord]) -> None:
        """Produce these records to the input."""
        await produce_records(self.bootstrap, self.topics.input, records)

    async def settled(self, total: int, timeout: float = 180) -> None:
        """Wait until ``total`` records came out (output, duplicates, dead letters) and a little longer; if they do
        not, say which records the sequence topic holds that did not come out."""

        async def out() -> bool:
            return sum(map(len, await self.results())) >= total

        try:
            await wait_for(out, timeout, f"{total} records out")
        except AssertionError as exc:
            output, duplicates, dead = await self.results()
            sequenced = _ids(Origins(sequenced=True).carried(await self._sequenced()).records)
            missing = sorted(set(sequenced) - set(_ids(output) + _ids(duplicates)))
            raise AssertionError(
                f"{exc}: {len(output)} published, {len(duplicates)} duplicates, {len(dead)} dead letters; "
                f"{len(sequenced)} sequenced, of which {len(missing)} did not come out: {missing[:10]}"
            ) from None
        await asyncio.sleep(2)

    async def single_core(self) -> tuple[list[str], list[str]]:
        """The ids one decision core keeps and drops deciding the sequence topic, in its order (a fresh index)."""
        settings = load_settings(None, **self.settings("oracle"))
        return await asyncio.to_thread(_single_core, settings, await self._sequenced())

    async def single_core_in_the_deciders_calls(self) -> list[str]:
        """The ids one decision core keeps deciding the sequence topic in order, in the calls the decider's
        verdict records name (its batches, and which of them it decided together), from a fresh index."""
        settings = load_settings(None, **self.settings("oracle"))
        shutil.rmtree(settings.index.path, ignore_errors=True)
        verdicts = await consume_records(self.bootstrap, verdicts_topic(self.sequence_topic))
        calls: list[list[BatchVerdicts]] = []
        for batch in (BatchVerdicts.unpacked(record.value) for record in verdicts):
            begins = not calls or batch.leads or calls[-1][-1].closes
            calls = [*calls, [batch]] if begins else [*calls[:-1], [*calls[-1], batch]]
        return await asyncio.to_thread(_single_core_in_calls, settings, await self._sequenced(), calls)

    def indexed(self, name: str) -> list[str]:
        """The ids an instance's index holds (the instance stopped), sorted."""
        settings = load_settings(None, **self.settings(name))
        with open_index(settings, self.index_path(name)) as index:
            return sorted(entry["id"] for entry in index.export())

    async def _sequenced(self) -> list[ConsumerRecord]:
        return await consume_records(self.bootstrap, self.sequence_topic)


def _single_core(settings: Settings, fetched: list[ConsumerRecord]) -> tuple[list[str], list[str]]:
    carried = Origins(sequenced=True).carried(fetched)
    records, origins = carried.records, carried.origins
    decoded = DocumentDecoder(settings.input).decode_many(
        [record.value for record in records],
        default_ids=[f"{r.topic}-{r.partition}-{r.offset}" for r in records],
        timestamps=[record.timestamp / 1000.0 for record in records],
        origins=origins,
    )
    documents = [item for item in decoded if isinstance(item, Document)]
    assert len(documents) == len(records)
    with open_index(settings, settings.index.path) as index:
        verdicts = Deduplicator(settings, index).decide(documents)
    kept = [doc.id for doc, novel in zip(documents, verdicts.novel.tolist(), strict=True) if novel]
    dropped = [doc.id for doc, novel in zip(documents, verdicts.novel.tolist(), strict=True) if not novel]
    return kept, dropped


def _single_core_in_calls(
    settings: Settings, fetched: list[ConsumerRecord], calls: list[list[BatchVerdicts]]
) -> list[str]:
    origins, decoder = Origins(sequenced=True), DocumentDecoder(settings.input)
    kept: list[str] = []
    with open_index(settings, settings.index.path) as index:
        dedup = Deduplicator(settings, index)
        for call in calls:
            documents: list[Document] = []
            parts: list[tuple[int, dict[tuple[str, int], int]]] = []
            for batch in call:
                carried = origins.carried([record for record in fetched if batch.first <= record.offset < batch.end])
                decoded = decoded_records(decoder, carried.records, carried.origins)
                documents += [item for item in decoded if isinstance(item, Document)]
                parts.append((len(documents), {(fetched[0].topic, 0): origins.index_offset(batch.end)}))
            verdicts = dedup.decide(documents, part_offsets=parts)
            kept += [doc.id for doc, novel in zip(documents, verdicts.novel.tolist(), strict=True) if novel]
    return kept


def _ids(records: list[ConsumerRecord]) -> list[str]:
    return [json.loads(record.value)["id"] for record in records]


def clusters(first: int, count: int, copies: int, seed: int) -> list[OutRecord]:
    """``count`` distinct texts from ``first`` on, each with ``copies`` near-copies (a word changed), every copy
    on another partition than its original and the others, all in one burst."""
    rng = random.Random(seed)
    records = []
    for cluster in range(first, first + count):
        words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(30)]
        for copy in range(copies + 1):
            text = list(words)
            if copy:
                text[rng.randrange(len(text))] = f"edit{copy}"
            value = json.dumps({"id": f"c{cluster}-{copy}", "text": " ".join(text)}).encode()
            records.append(OutRecord(value, partition=(cluster + copy) % _PARTITIONS))
    return records


def natural(first: int, count: int) -> list[OutRecord]:
    """Texts of the shipped natural split (package descriptions: templates, forks, boilerplate), spread over the
    partitions in turn."""
    shipped, _ = load_natural()
    return [
        OutRecord(json.dumps({"id": doc.id, "text": doc.text}).encode(), partition=row % _PARTITIONS)
        for row, doc in enumerate(shipped[first : first + count], start=first)
    ]


def renamed(records: list[OutRecord], prefix: str, shift: int) -> list[OutRecord]:
    """The same texts under new ids (``prefix`` before the old one), the i-th on partition i + ``shift``."""
    return [
        OutRecord(record.value.replace(b'"id": "', b'"id": "' + prefix.encode()), partition=(i + shift) % _PARTITIONS)
        for i, record in enumerate(records)
        if record.value is not None
    ]


async def assert_exactly_once_as_one_core(
    deployment: Deployment, produced: list[OutRecord], *, every_call_recorded: bool = True
) -> None:
    output, duplicates, dead = await deployment.results()
    produced_ids = sorted(json.loads(record.value or b"")["id"] for record in produced)
    # None lost, none twice, none dead-lettered.
    assert sorted(_ids(output) + _ids(duplicates)) == produced_ids
    assert dead == []
    kept, dropped = await deployment.single_core()
    # The same verdicts as one core over the sequence topic's order, published in that order.
    assert _ids(output) == kept
    assert sorted(_ids(duplicates)) == sorted(dropped)
    if every_call_recorded:
        # And as one core deciding that order in the decider's calls, as the verdict records name them.
        assert await deployment.single_core_in_the_deciders_calls() == kept


@pytest.fixture
async def deployment(kafka_bootstrap: str, topic_factory: Any, tmp_path: Path) -> Any:
    topics = Topics(
        input=await topic_factory(_PARTITIONS, prefix="in"),
        output=await topic_factory(1, prefix="out"),
        duplicates=await topic_factory(1, prefix="dup"),
        dead_letters=await topic_factory(1, prefix="dlq"),
    )
    deployment = Deployment(kafka_bootstrap, topics, tmp_path)
    try:
        yield deployment
    finally:
        for process in deployment.processes.values():
            process.kill()
            process.wait(30)


async def _deciding(deployment: Deployment) -> bool:
    return deployment.decider() is not None


async def started(deployment: Deployment, names: list[str]) -> None:
    for name in names:
        deployment.start(name)
    await wait_for(lambda: _deciding(deployment), 120, "an instance to decide")


async def test_three_instances_decide_near_copies_spread_over_partitions_as_one_core(deployment: Deployment) -> None:
    deployment.workers = 1
    await started(deployment, ["a", "b", "c"])
    produced = clusters(0, 150, copies=2, seed=1)
    await deployment.produce(produced)
    await deployment.settled(len(produced))
    assert deployment.stop_all() == {"a": 0, "b": 0, "c": 0}
    await assert_exactly_once_as_one_core(deployment, produced)
    # Each cluster's copies came in at once on three partitions, and one of each was kept.
    output, _, _ = await deployment.results()
    assert sorted({doc_id.split("-")[0] for doc_id in _ids(output)}) == sorted(f"c{i}" for i in range(150))
    assert len(output) == 150
    # Every instance sequenced some of the input: the partitions were shared.
    for name in ("a", "b", "c"):
        assert "sequencing " in deployment.log(name).read_text()


async def test_kill_9_of_a_random_instance_every_few_seconds_changes_nothing(deployment: Deployment) -> None:
    """Input flows all along, in bursts every 0.2 s, while every few seconds a random instance (the decider as
    often as not) is killed with SIGKILL and started again after up to 8 s (past its session timeout at times,
    when the others take its roles over). Some bursts repeat earlier documents under new ids, on other
    partitions."""
    names = ["a", "b", "c"]
    await started(deployment, names)
    rng = random.Random(9)
    produced: list[OutRecord] = []

    async def feed() -> None:
        for burst in range(150):
            records = clusters(burst * 10, 10, copies=1, seed=1000 + burst)
            if burst % 5 == 4:
                originals = [record for record in rng.sample(produced, 10) if b'"again-' not in (record.value or b"")]
                records += renamed(originals, "again-", 3)
            await deployment.produce(records)
            produced.extend(records)
            await asyncio.sleep(0.2)

    feeding = asyncio.create_task(feed())
    kills = 0
    while not feeding.done():
        await asyncio.sleep(rng.uniform(2.0, 4.0))
        victim = deployment.decider() if kills % 2 == 0 else rng.choice(names)
        if victim is None or victim not in deployment.processes:
            continue
        deployment.kill(victim)
        kills += 1
        await asyncio.sleep(rng.uniform(0.5, 8.0))
        deployment.start(victim)
    await feeding
    assert kills >= 5
    await deployment.settled(len(produced), timeout=300)
    assert set(deployment.stop_all().values()) == {0}
    await assert_exactly_once_as_one_core(deployment, produced)
    # A repeated document and its original were never both published: usually the repeat was dropped, but the
    # original when a sequencer died before committing it and the repeat, on another partition, came first.
    output, _, _ = await deployment.results()
    published = set(_ids(output))
    again = {json.loads(record.value or b"")["id"] for record in produced if b'"again-' in (record.value or b"")}
    assert again
    assert [doc_id for doc_id in again if doc_id in published and doc_id.removeprefix("again-") in published] == []


async def test_a_frozen_decider_is_fenced_and_stands_by_when_it_wakes(deployment: Deployment) -> None:
    await started(deployment, ["a", "b"])
    first = clusters(0, 40, copies=1, seed=3)
    await deployment.produce(first)
    await deployment.settled(len(first))
    frozen = deployment.decider()
    assert frozen is not None
    other = "b" if frozen == "a" else "a"
    took_over = deployment.log(other).read_text().count("deciding the sequence topic") + 1
    deployment.processes[frozen].send_signal(signal.SIGSTOP)
    await wait_for(lambda: _state_is(deployment.processes[frozen].pid, "T"), 10, "the decider to stop")
    second = clusters(40, 40, copies=1, seed=4)
    await deployment.produce(second)
    await wait_for(lambda: _logged(deployment.log(other), "deciding the sequence topic", took_over), 90, "a takeover")
    await asyncio.sleep(1.5 * max(_SESSION_MS, _TRANSACTION_MS) / 1000)
    deployment.processes[frozen].send_signal(signal.SIGCONT)
    third = clusters(80, 40, copies=1, seed=5)
    await deployment.produce(third)
    produced = first + second + third
    await deployment.settled(len(produced))
    # The woken instance was fenced and went on standing by; it did not exit.
    assert deployment.processes[frozen].poll() is None
    assert set(deployment.stop_all().values()) == {0}
    await assert_exactly_once_as_one_core(deployment, produced)


async def test_a_standby_follows_the_decider_and_takes_over_with_nothing_to_replay(deployment: Deployment) -> None:
    deployment.metrics_ports = {"a": free_port(), "b": free_port()}
    await started(deployment, ["a", "b"])
    first = clusters(0, 200, copies=1, seed=8)
    await deployment.produce(first)
    await deployment.settled(len(first))
    decider = deployment.decider()
    assert decider is not None
    standby = "b" if decider == "a" else "a"
    # The standby keeps its index's gauges (which the alerts read) as the decider does: refreshed every 5 s, before
    # a batch is stored, so one more document after that long shows every document the first ones kept.
    kept_first = len((await deployment.results())[0])
    await asyncio.sleep(6)
    probe = [OutRecord(json.dumps({"id": "probe", "text": "a text of its own, unlike any other here"}).encode())]
    await deployment.produce(probe)
    await deployment.settled(len(first) + 1)
    assert await deployment.gauge(standby, "streamdedup_standby") == 1
    assert await deployment.gauge(standby, "streamdedup_index_entries") == kept_first
    first += probe
    followed = deployment.log(standby).read_text()
    assert "following the decider" in followed and "level with the decider at sequence offset" in followed
    assert "replaying those records" not in followed
    # It left the group: the standby is given the sequence partition at once, level with the decider.
    owned = followed.count("owning all 1 input partitions") + 1
    assert deployment.stop(decider) == 0
    await wait_for(lambda: _logged(deployment.log(standby), "owning all 1 input partitions", owned), 60, "a takeover")
    takeover = deployment.log(standby).read_text()[len(followed) :]
    assert "deciding the sequence topic" in takeover
    assert "replaying those records" not in takeover
    second = renamed(first, "copy-", 2)
    await deployment.produce(second)
    produced = first + second
    await deployment.settled(len(produced))
    assert set(deployment.stop_all().values()) == {0}
    await assert_exactly_once_as_one_core(deployment, produced)
    output, _, _ = await deployment.results()
    assert not [doc_id for doc_id in _ids(output) if doc_id.startswith("copy-")]


async def test_an_instance_that_joins_shares_the_input_and_leaves_the_decider_its_role(deployment: Deployment) -> None:
    await started(deployment, ["a", "b"])
    first = clusters(0, 100, copies=1, seed=10)
    await deployment.produce(first)
    await deployment.settled(len(first))
    decider = deployment.decider()
    # The newcomer's name sorts first, which is who Kafka's own assignors would give the partition to.
    deployment.start("0-new")
    await wait_for(lambda: _logged(deployment.log("0-new"), "sequencing ", 1), 60, "the newcomer to sequence")
    second = clusters(100, 100, copies=1, seed=11)
    await deployment.produce(second)
    produced = first + second
    await deployment.settled(len(produced))
    assert deployment.decider() == decider
    assert "deciding the sequence topic" not in deployment.log("0-new").read_text()
    assert set(deployment.stop_all().values()) == {0}
    await assert_exactly_once_as_one_core(deployment, produced)


async def test_an_index_deleted_on_every_instance_is_rebuilt_from_the_sequence_topic(deployment: Deployment) -> None:
    await started(deployment, ["a", "b"])
    first = clusters(0, 60, copies=1, seed=6)
    await deployment.produce(first)
    await deployment.settled(len(first))
    assert deployment.stop_all() == {"a": 0, "b": 0}
    for name in ("a", "b"):
        shutil.rmtree(deployment.index_path(name))
    for name in ("a", "b"):
        deployment.start(name)
    # Copies (new ids) of the first documents, and new ones.
    copies = renamed(first[::2], "copy-", 1)
    second = clusters(60, 20, copies=1, seed=7)
    await deployment.produce(copies + second)
    produced = first + copies + second
    await deployment.settled(len(produced))
    assert set(deployment.stop_all().values()) == {0}
    await assert_exactly_once_as_one_core(deployment, produced)
    _, duplicates, _ = await deployment.results()
    assert {doc_id for doc_id in _ids(duplicates) if doc_id.startswith("copy-")} == {f"copy-c{i}-0" for i in range(60)}


async def test_every_index_holds_what_the_decider_published_even_where_its_batch_cuts_decide(
    deployment: Deployment,
) -> None:
    """Tight candidate bounds on natural text make some of the decider's verdicts depend on how its batches were
    cut (see ``test_decide``): the standby's index, and indexes rebuilt from Kafka alone, still hold exactly the
    documents it published, as they store its verdicts instead of deciding again."""
    deployment.dedup = {"max_candidates": 2, "key_capacity": 4}
    await started(deployment, ["a", "b"])
    first = natural(0, 1500)
    await deployment.produce(first)
    await deployment.settled(len(first))
    decider = deployment.decider()
    assert decider is not None
    standby = "b" if decider == "a" else "a"
    assert "following the decider" in deployment.log(standby).read_text()
    assert deployment.stop_all() == {"a": 0, "b": 0}
    output, duplicates, _ = await deployment.results()
    assert 0 < len(duplicates) < len(first)
    assert deployment.indexed(decider) == deployment.indexed(standby) == sorted(_ids(output))
    # One decision core over the same order, in the decider's calls, publishes the same, in the same order.
    assert await deployment.single_core_in_the_deciders_calls() == _ids(output)
    for name in ("a", "b"):
        shutil.rmtree(deployment.index_path(name))
    await started(deployment, ["a", "b"])
    second = natural(1500, 500)
    await deployment.produce(second)
    produced = first + second
    await deployment.settled(len(produced))
    assert deployment.stop_all() == {"a": 0, "b": 0}
    output, duplicates, dead = await deployment.results()
    assert sorted(_ids(output) + _ids(duplicates)) == sorted(json.loads(r.value or b"")["id"] for r in produced)
    assert dead == []
    assert deployment.indexed("a") == deployment.indexed("b") == sorted(_ids(output))
    assert await deployment.single_core_in_the_deciders_calls() == _ids(output)
    logs = deployment.log("a").read_text() + deployment.log("b").read_text()
    assert "level with the decider's verdicts" in logs
    assert "no verdict record covers" not in logs


async def test_sequence_records_without_verdict_records_are_decided_again(deployment: Deployment) -> None:
    """A deployment upgraded from a version that published no verdict records (here: its verdicts topic deleted
    while every instance was stopped, and its indexes lost): the new decider decides again what no verdict record
    covers, the standby too once the decider's next verdicts show the gap, and nothing is published twice."""
    await started(deployment, ["a", "b"])
    first = clusters(0, 60, copies=1, seed=12)
    await deployment.produce(first)
    await deployment.settled(len(first))
    assert deployment.stop_all() == {"a": 0, "b": 0}
    async with admin_client(bootstrap_servers=deployment.bootstrap) as admin:
        await admin.delete_topics([verdicts_topic(deployment.sequence_topic)])
    for name in ("a", "b"):
        shutil.rmtree(deployment.index_path(name))
    await started(deployment, ["a", "b"])
    copies = renamed(first[::2], "copy-", 1)
    await deployment.produce(copies)
    produced = first + copies
    await deployment.settled(len(produced))
    decider = deployment.decider()
    standby = "b" if decider == "a" else "a"
    await wait_for(
        lambda: _logged(deployment.log(standby), "no verdict record covers", 1), 60, "the standby's catch-up"
    )
    assert deployment.stop_all() == {"a": 0, "b": 0}
    # The first run's verdict records are gone: its calls are not recorded.
    await assert_exactly_once_as_one_core(deployment, produced, every_call_recorded=False)
    output, duplicates, _ = await deployment.results()
    assert {doc_id for doc_id in _ids(duplicates) if doc_id.startswith("copy-")} == {f"copy-c{i}-0" for i in range(60)}
    assert deployment.indexed("a") == deployment.indexed("b") == sorted(_ids(output))
    assert "no verdict record covers" in deployment.log(decider).read_text()


async def test_the_sequence_and_verdicts_topics_are_made_with_one_partition_and_refused_with_more(
    kafka_bootstrap: str,
) -> None:
    unique = uuid.uuid4().hex[:8]
    settings = load_settings(None, kafka={"bootstrap_servers": kafka_bootstrap, "sequence_topic": f"seq-{unique}"})
    async with admin_client(bootstrap_servers=kafka_bootstrap) as admin:
        await prepare_sequence_topic(admin, settings)
        assert await partition_counts(admin, [f"seq-{unique}", f"seq-{unique}.verdicts"]) == {
            f"seq-{unique}": 1,
            f"seq-{unique}.verdicts": 1,
        }
        crowded = load_settings(None, kafka={"bootstrap_servers": kafka_bootstrap, "sequence_topic": f"two-{unique}"})
        await ensure_topics(admin, {f"two-{unique}.verdicts": 2})
        with pytest.raises(ConfigError, match=f"the topic two-{unique}.verdicts has 2 partitions"):
            await prepare_sequence_topic(admin, crowded)


async def test_a_broker_restart_while_input_flows_changes_nothing(tmp_path: Path) -> None:
    """Two instances on a broker of their own (the session's is shared): input flows in bursts every 0.2 s,
    and between two bursts the broker stops, stays down 5 s and starts again on the same address and data.
    The instances ride it out (none exits), every record comes out exactly once, as one core decides, and the
    client's retries do not flood the logs."""
    broker = LocalBroker(tmp_path / "broker")
    deployment: Deployment | None = None
    try:
        bootstrap = await asyncio.to_thread(broker.start)
        unique = uuid.uuid4().hex[:8]
        topics = Topics(f"in-{unique}", f"out-{unique}", f"dup-{unique}", f"dlq-{unique}")
        async with admin_client(bootstrap_servers=bootstrap) as admin:
            await ensure_topics(
                admin, {topics.input: _PARTITIONS, topics.output: 1, topics.duplicates: 1, topics.dead_letters: 1}
            )
        deployment = Deployment(bootstrap, topics, tmp_path)
        await started(deployment, ["a", "b"])
        produced: list[OutRecord] = []
        # Held for each burst: the broker goes down between bursts, never under one (a burst it cut would be
        # neither surely in nor surely out).
        up = asyncio.Lock()

        async def feed() -> None:
            for burst in range(80):
                records = clusters(burst * 10, 10, copies=1, seed=2000 + burst)
                async with up:
                    await produce_records(bootstrap, topics.input, records)
                produced.extend(records)
                await asyncio.sleep(0.2)

        feeding = asyncio.create_task(feed())
        await wait_for(lambda: _produced(produced, 600), 60, "input before the restart")
        async with up:
            await asyncio.to_thread(broker.stop)
            await asyncio.sleep(5)
            # Same port and data: the instances must reconnect to what they knew, not to a new cluster.
            assert await asyncio.to_thread(broker.start) == bootstrap
        restarted_at = len(produced)
        await feeding
        # Input flowed after the restart too.
        assert len(produced) > restarted_at
        assert all(process.poll() is None for process in deployment.processes.values())
        await deployment.settled(len(produced), timeout=300)
        assert deployment.stop_all() == {"a": 0, "b": 0}
        await assert_exactly_once_as_one_core(deployment, produced)
        for name in ("a", "b"):
            # The client retries several times a second while the broker is down; its line shows once.
            assert 1 <= deployment.log(name).read_text().count("Unable connect to node") <= 3
    finally:
        if deployment is not None:
            for process in deployment.processes.values():
                process.kill()
                process.wait(30)
        await asyncio.to_thread(broker.stop)


async def _produced(produced: list[OutRecord], count: int) -> bool:
    return len(produced) >= count


async def _state_is(pid: int, state: str) -> bool:
    return process_state(pid) == state


async def _logged(path: Path, text: str, count: int) -> bool:
    return path.read_text().count(text) >= count
