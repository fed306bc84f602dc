"""``streamdedup demo``: a local broker, the service, the bundled sample feed, and a summary of what happened."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from .document import Document, DocumentDecoder
from .kafka.admin import admin_client, ensure_topics
from .kafka.broker import LocalBroker
from .kafka.clients import common_options
from .kafka.consumer import committed_reader
from .names import (
    HEADER_MATCH_DISTANCE,
    HEADER_MATCH_ID,
    HEADER_MATCH_JACCARD,
    HEADER_MATCH_REASON,
    HEADER_MATCH_THRESHOLD,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
)
from .service import DedupService, ServiceStats
from .settings import Settings

__all__ = ["SAMPLE_FEED", "run_demo"]

SAMPLE_FEED = resources.files("streamdedup") / "data" / "sample_feed.jsonl"

# Records every feed has trouble with sooner or later; the demo sends them to show the dead-letter topic.
_BAD_RECORDS: tuple[bytes | None, ...] = (b'{"text": "a record cut off mid-', b'{"text": "caf\xe9 latin-1"}', None)


@dataclass(frozen=True)
class _Run:
    settings: Settings
    lines: list[bytes | None]


def run_demo(
    settings: Settings,
    *,
    feed: Path | None = None,
    keep_broker: bool = False,
    bootstrap: str | None = None,
    work_dir: Path = Path("var"),
) -> int:
    """Run the demo; with ``bootstrap`` it uses that broker instead of starting the local one."""
    feed_path = Path(str(feed or SAMPLE_FEED))
    if not feed_path.is_file():
        print(f"streamdedup demo: feed not found: {feed_path}")
        return 1
    if feed is None:
        # The bundled feed carries its own ids and event times.
        settings = settings.model_copy(
            update={"input": settings.input.model_copy(update={"id_field": "id", "time_field": "time"})}
        )
    broker = None
    if bootstrap is None:
        broker = LocalBroker(work_dir / "kafka")
        keep_broker = keep_broker or broker.running()
        print("starting the local Kafka broker (the first run fetches it from Maven Central) ...", flush=True)
        bootstrap = broker.start()
    print(f"broker: {bootstrap}")
    try:
        run = _prepare(settings, bootstrap, feed_path, work_dir)
        stats, published, duplicates = asyncio.run(_demo(run))
        _print_summary(run, stats, published, [_dropped(record, run.settings) for record in duplicates])
    finally:
        if broker is not None and not keep_broker:
            broker.stop()
            print("broker stopped")
    return 0


def _prepare(settings: Settings, bootstrap: str, feed_path: Path, work_dir: Path) -> _Run:
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    kafka = settings.kafka.model_copy(
        update={
            "bootstrap_servers": bootstrap,
            "input_topics": [f"demo-{run_id}-input"],
            "output_topic": f"demo-{run_id}-output",
            "duplicates_topic": f"demo-{run_id}-duplicates",
            "dead_letter_topic": f"demo-{run_id}-dead-letters",
            "group_id": f"demo-{run_id}",
            "transactional_id": f"demo-{run_id}",
        }
    )
    index = settings.index.model_copy(update={"path": work_dir / "demo" / run_id / "index"})
    metrics = settings.metrics.model_copy(update={"host": "127.0.0.1", "port": 0})
    demo_settings = settings.model_copy(update={"kafka": kafka, "index": index, "metrics": metrics})
    lines: list[bytes | None] = [line.rstrip(b"\r\n") for line in feed_path.read_bytes().splitlines() if line.strip()]
    return _Run(demo_settings, [*lines, *_BAD_RECORDS])


async def _demo(run: _Run) -> tuple[ServiceStats, int, list[ConsumerRecord]]:
    kafka = run.settings.kafka
    topic = kafka.input_topics[0]
    async with admin_client(**common_options(kafka)) as admin:
        await ensure_topics(admin, {topic: 1})
    async with DedupService(run.settings) as service:
        print(f"service up; metrics on http://127.0.0.1:{service.health_port}/metrics")
        print(f"feeding {len(run.lines)} records into {topic} ...", flush=True)
        await _produce(kafka.bootstrap_servers, topic, run.lines)
        async with asyncio.timeout(300):
            while service.stats.consumed < len(run.lines):
                if not service.running:
                    await service.wait()  # raises what ended the loop
                await asyncio.sleep(0.2)
        stats = service.stats
    published = len(await _read_committed(kafka.bootstrap_servers, kafka.output_topic))
    duplicates = (
        await _read_committed(kafka.bootstrap_servers, kafka.duplicates_topic) if kafka.duplicates_topic else []
    )
    return stats, published, duplicates


async def _produce(bootstrap: str, topic: str, values: Sequence[bytes | None]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        # A null value needs a key (Kafka's tombstones); the others go without.
        sent = [await producer.send(topic, value, key=None if value else b"tombstone") for value in values]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def _read_committed(bootstrap: str, topic: str) -> list[ConsumerRecord]:
    """The records of ``topic`` as a read_committed consumer sees them (what downstream really gets)."""
    records: list[ConsumerRecord] = []
    async with committed_reader(bootstrap, topic) as (consumer, tp):
        end = (await consumer.end_offsets([tp]))[tp]
        async with asyncio.timeout(60):
            while await consumer.position(tp) < end:
                records.extend((await consumer.getmany(tp, timeout_ms=500)).get(tp, []))
        return records


@dataclass(frozen=True)
class _Dropped:
    """A record of the duplicates topic: the document's id and what its headers say decided."""

    id: str
    match_id: str
    reason: str
    jaccard: float | None
    threshold: float | None
    distance: int

    def why(self) -> str:
        jaccard = "?" if self.jaccard is None else f"{self.jaccard:.3f}"
        if self.reason == "redelivered":
            return f"redelivered (its id again, from another record), estimated Jaccard {jaccard}"
        if self.threshold is None:
            return f"{self.reason}, estimated Jaccard {jaccard} (dedup.verify off: no threshold)"
        return f"{self.reason}, estimated Jaccard {jaccard} >= threshold {self.threshold}"


def _dropped(record: ConsumerRecord, settings: Settings) -> _Dropped:
    headers = {key: value.decode() for key, value in record.headers}

    def number(name: str) -> float | None:
        return float(headers[name]) if name in headers else None

    # The id the service gave it: the document's own, else its source position.
    source = f"{headers[HEADER_SOURCE_TOPIC]}-{headers[HEADER_SOURCE_PARTITION]}-{headers[HEADER_SOURCE_OFFSET]}"
    item = DocumentDecoder(settings.input).decode(record.value, default_id=source, timestamp=0.0)
    return _Dropped(
        item.id,
        headers[HEADER_MATCH_ID],
        headers[HEADER_MATCH_REASON],
        number(HEADER_MATCH_JACCARD),
        number(HEADER_MATCH_THRESHOLD),
        int(headers[HEADER_MATCH_DISTANCE]),
    )


def _print_summary(run: _Run, stats: ServiceStats, published: int, dropped: list[_Dropped], examples: int = 5) -> None:
    kafka = run.settings.kafka
    topic = kafka.input_topics[0]
    decoder = DocumentDecoder(run.settings.input)
    texts = {}
    for offset, line in enumerate(run.lines):
        item = decoder.decode(line, default_id=f"{topic}-0-{offset}", timestamp=0.0)
        if isinstance(item, Document):
            texts[item.id] = item.text
    print()
    print("summary")
    print(f"  consumed:       {stats.consumed}")
    print(f"  published:      {published} (read back from {kafka.output_topic}, read_committed)")
    print(
        f"  dropped:        {sum(stats.dropped.values())} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(stats.dropped.items())) or 'none'})"
    )
    for jaccard_range in _jaccard_ranges(dropped):
        print(f"    {jaccard_range}")
    print(f"  dead-lettered:  {sum(stats.dead_lettered.values())} ({_reasons(stats)})")
    print(f"  transactions:   {stats.transactions}")
    if dropped:
        print(f"  examples of dropped duplicates (as the headers of {kafka.duplicates_topic} give them):")
        for each in dropped[:examples]:
            print(f"    {each.id} duplicates {each.match_id}: {each.why()} (Hamming distance {each.distance})")
            print(f"      dropped: {_short(texts.get(each.id, '?'))}")
            print(f"      kept:    {_short(texts.get(each.match_id, '?'))}")


def _jaccard_ranges(dropped: list[_Dropped]) -> list[str]:
    """Per reason, the estimated Jaccard of the dropped documents (least to greatest, median) and the threshold."""
    lines = []
    for reason in sorted({each.reason for each in dropped}):
        ones = [each for each in dropped if each.reason == reason]
        values = [each.jaccard for each in ones if each.jaccard is not None]
        if not values:
            continue
        # One run, one threshold; a redelivery is dropped by its id, whatever its Jaccard.
        threshold = ones[0].threshold
        held = (
            "" if reason == "redelivered" else ", dedup.verify off" if threshold is None else f", threshold {threshold}"
        )
        median = statistics.median(values)
        lines.append(f"{reason}: estimated Jaccard {min(values):.3f} to {max(values):.3f}, median {median:.3f}{held}")
    return lines


def _reasons(stats: ServiceStats) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(stats.dead_lettered.items())) or "none"


def _short(text: str, width: int = 100) -> str:
    flat = json.dumps(text, ensure_ascii=False)[1:-1]
    return flat if len(flat) <= width else flat[: width - 1] + "…"
