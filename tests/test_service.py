"""The Kafka service against the real broker and a real LMDB index: end to end (also over SASL and TLS), dead
letters, signals, a second instance, kill -9 crash loops and a broker outage (the last two marked slow)."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import random
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import NewTopic
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import ConsumerRecord

from streamdedup import service as service_module
from streamdedup.decide import Deduplicator, open_index
from streamdedup.decision_process import DecisionProcess
from streamdedup.document import Document, DocumentDecoder
from streamdedup.fingerprint import fingerprint_hex
from streamdedup.kafka.admin import admin_client, ensure_topics
from streamdedup.kafka.broker import LocalBroker
from streamdedup.kafka.producer import send_batched
from streamdedup.kafka.records import OutgoingRecord
from streamdedup.metrics import WORKER_KINDS
from streamdedup.names import (
    HEADER_DEAD_LETTER_DETAIL,
    HEADER_DEAD_LETTER_ERROR,
    HEADER_DEAD_LETTER_REASON,
    HEADER_DEAD_LETTER_TRUNCATED,
    HEADER_FINGERPRINT,
    HEADER_MATCH_DISTANCE,
    HEADER_MATCH_ID,
    HEADER_MATCH_JACCARD,
    HEADER_MATCH_REASON,
    HEADER_MATCH_THRESHOLD,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
)
from streamdedup.service import DedupService, dedup_service, signer_supervisor
from streamdedup.settings import Settings, load_settings
from streamdedup.signature import Signatures, SignerPool
from tests.conftest import (
    SECURED_USER,
    OutRecord,
    SecuredKafka,
    consume_records,
    plant_decision_bug,
    plant_decision_crash,
    plant_signing_bug,
    process_running,
    process_state,
    produce_records,
)

pytestmark = pytest.mark.integration

STREAMDEDUP = Path(sys.executable).parent / "streamdedup"


@dataclass(frozen=True)
class Topics:
    input: str
    output: str
    duplicates: str
    dead_letters: str


@pytest.fixture
async def topics(topic_factory: Any) -> Topics:
    return Topics(
        input=await topic_factory(1, prefix="in"),
        output=await topic_factory(1, prefix="out"),
        duplicates=await topic_factory(1, prefix="dup"),
        dead_letters=await topic_factory(1, prefix="dlq"),
    )


def overrides(bootstrap: str, topics: Topics, index_path: Path, **kafka: Any) -> dict[str, Any]:
    """Settings for one test: its own topics, group, transactional id and index."""
    unique = uuid.uuid4().hex[:8]
    return {
        "kafka": {
            "bootstrap_servers": bootstrap,
            "input_topics": [topics.input],
            "output_topic": topics.output,
            "duplicates_topic": topics.duplicates,
            "dead_letter_topic": topics.dead_letters,
            "group_id": f"group-{unique}",
            "transactional_id": f"tx-{unique}",
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 1000,
            "batch_timeout_ms": 50,
            **kafka,
        },
        "index": {"path": str(index_path), "expected_entries": 100_000, "max_age_seconds": None},
        "metrics": {"enabled": False},
    }


def write_config(path: Path, settings: dict[str, Any]) -> Path:
    path.write_text(json.dumps(settings))  # JSON is YAML
    return path


def header(record: ConsumerRecord, name: str) -> bytes:
    values = [value for key, value in record.headers if key == name]
    assert len(values) == 1, (name, record.headers)
    return values[0]


def assert_same_output(output: Sequence[ConsumerRecord], expected: list[tuple[bytes, str]]) -> None:
    """Message for message; on a difference, say whether records were repeated or verdicts differ."""
    got = [(r.value, header(r, HEADER_FINGERPRINT).decode()) for r in output]
    if got == expected:
        return
    repeated = len(got) - len(set(got))
    pairs = enumerate(zip(got, expected, strict=False))
    first = next((i for i, (a, b) in pairs if a != b), min(len(got), len(expected)))
    raise AssertionError(
        f"output differs from the offline run: {len(got)} records vs {len(expected)} expected, {repeated} "
        f"repeated, first difference at output index {first} "
        f"(offset {output[first].offset if first < len(output) else None})"
    )


async def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.2)


async def committed_offset(bootstrap: str, group: str, topic: str, partition: int = 0) -> int:
    return await kafka_committed(bootstrap, group, topic, partition) or 0


async def kafka_committed(bootstrap: str, group: str, topic: str, partition: int = 0) -> int | None:
    """The group's committed offset of the partition, None when Kafka has none."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(topic, partition))
    finally:
        await consumer.stop()


def offline_novel(
    settings: Settings, index_path: Path, stream: Sequence[OutRecord], topic: str, batch: int
) -> list[tuple[bytes, str]]:
    """(value, fingerprint hex) of what one uninterrupted offline run through the decision core keeps."""
    kept = []
    with open_index(settings, index_path) as index:
        dedup = Deduplicator(settings, index)
        for start in range(0, len(stream), batch):
            docs = stream_documents(settings, stream[start : start + batch], topic, start)
            verdicts = dedup.decide([doc for _, doc in docs])
            pairs = zip(docs, verdicts, strict=True)
            kept += [(r.value, fingerprint_hex(v.fingerprint)[0]) for (r, _), v in pairs if v.novel]
    return kept


def stream_documents(
    settings: Settings, records: Sequence[OutRecord], topic: str, first_offset: int = 0
) -> list[tuple[OutRecord, Document]]:
    """The documents of these records of partition 0 from ``first_offset`` on, as the service decodes them, each
    with its origin; records that are no document are left out."""
    decoder = DocumentDecoder(settings.input)
    docs = []
    for offset, record in enumerate(records, first_offset):
        item = decoder.decode(record.value, default_id=f"{topic}-0-{offset}", timestamp=record.timestamp_ms / 1000)
        if isinstance(item, Document):
            docs.append((record, Document(item.id, item.text, item.time, (topic, 0, offset))))
    return docs


def synthetic_stream(n: int, seed: int, *, bad_every: int = 0) -> list[OutRecord]:
    """Tweet-sized JSON texts, about a third of them edited copies of earlier ones, with event timestamps."""
    rng = random.Random(seed)
    # Recent timestamps: a broker with time-based retention would delete records dated long ago.
    base_ms = (int(time.time()) - n) * 1000
    vocabulary = [
        f"{rng.choice('bcdfghklmnprstvz')}{rng.choice('aeiou')}{rng.choice('bcdfgklmnprst')}{i}" for i in range(4000)
    ]
    texts: list[str] = []
    records = []
    for i in range(n):
        if bad_every and i % bad_every == bad_every - 1:
            records.append(OutRecord(b'{"text": ', key=f"k{i}".encode(), timestamp_ms=base_ms + i * 1000))
            continue
        if texts and rng.random() < 0.35:
            words = rng.choice(texts).split()
            words[rng.randrange(len(words))] = rng.choice(vocabulary) if rng.random() < 0.5 else words[0]
            text = " ".join(words) if rng.random() < 0.7 else rng.choice(texts)
        else:
            text = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(12, 24)))
        texts.append(text)
        value = json.dumps({"text": text, "n": i}).encode()
        records.append(OutRecord(value, key=f"k{i}".encode(), timestamp_ms=base_ms + i * 1000))
    return records


# ---------------------------------------------------------------------------------------------- end to end


async def test_novel_duplicates_and_dead_letters_end_to_end(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path
) -> None:
    base = "streaming near duplicate detection keeps only the first copy of every story it sees today"
    stream = [
        OutRecord(json.dumps({"text": base}).encode(), key=b"a", headers=(("origin", b"feed-1"),)),
        OutRecord(
            json.dumps({"text": "an entirely unrelated sentence about cooking pasta at home"}).encode(), key=b"b"
        ),
        OutRecord(json.dumps({"text": base}).encode(), key=b"c", headers=(("origin", b"feed-2"),)),
        OutRecord(b'{"text": "broken', key=b"d", headers=(("origin", b"feed-3"),)),
        OutRecord(json.dumps({"text": "RT @someone: " + base.upper() + "!!"}).encode(), key=b"e"),
        OutRecord(None, key=b"f"),
        OutRecord(json.dumps({"text": "after the bad records the partition still flows normally"}).encode(), key=b"g"),
    ]
    await kafka_produce(topics.input, stream)
    settings = load_settings(None, **overrides(kafka_bootstrap, topics, tmp_path / "index"))

    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, len(stream)), 60, "the stream to be processed")
        stats = service.stats

    output = await kafka_consume(topics.output, count=3)
    assert [(r.key, r.value) for r in output] == [
        (b"a", stream[0].value),
        (b"b", stream[1].value),
        (b"g", stream[6].value),
    ]
    assert [h for h in output[0].headers if h[0] == "origin"] == [("origin", b"feed-1")]
    assert len(header(output[0], HEADER_FINGERPRINT)) == settings.fingerprint.width // 4
    assert int(header(output[0], HEADER_FINGERPRINT), 16) != int(header(output[1], HEADER_FINGERPRINT), 16)

    duplicates = await kafka_consume(topics.duplicates, count=2)
    assert [(r.key, r.value) for r in duplicates] == [(b"c", stream[2].value), (b"e", stream[4].value)]
    first_id = f"{topics.input}-0-0"
    assert [header(r, HEADER_MATCH_ID).decode() for r in duplicates] == [first_id, first_id]
    assert header(duplicates[0], HEADER_MATCH_DISTANCE) == b"0"
    assert header(duplicates[0], HEADER_MATCH_REASON) == b"exact"
    assert header(duplicates[1], HEADER_MATCH_REASON) in (b"exact", b"near")
    assert [(header(r, HEADER_MATCH_JACCARD), header(r, HEADER_MATCH_THRESHOLD)) for r in duplicates] == [
        (b"1.000", b"0.55")
    ] * 2
    assert header(duplicates[0], HEADER_FINGERPRINT) == header(output[0], HEADER_FINGERPRINT)
    assert [h for h in duplicates[0].headers if h[0] == "origin"] == [("origin", b"feed-2")]

    dead = await kafka_consume(topics.dead_letters, count=2)
    assert [(r.key, r.value) for r in dead] == [(b"d", b'{"text": "broken'), (b"f", None)]
    assert [header(r, HEADER_DEAD_LETTER_REASON) for r in dead] == [b"invalid_json", b"null_value"]
    assert [h for h in dead[0].headers if h[0] == "origin"] == [("origin", b"feed-3")]
    assert [
        (header(r, HEADER_SOURCE_TOPIC), header(r, HEADER_SOURCE_PARTITION), header(r, HEADER_SOURCE_OFFSET))
        for r in dead
    ] == [
        (topics.input.encode(), b"0", b"3"),
        (topics.input.encode(), b"0", b"5"),
    ]

    assert (stats.consumed, stats.published, dict(stats.dead_lettered)) == (7, 3, {"invalid_json": 1, "null_value": 1})
    assert sum(stats.dropped.values()) == 2
    assert await committed_offset(kafka_bootstrap, settings.kafka.group_id, topics.input) == len(stream)


async def test_input_compressed_with_every_kafka_codec_is_read(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path
) -> None:
    # Producers commonly compress; a topic's compression.type makes the broker store its batches that way.
    codecs = ["gzip", "snappy", "lz4", "zstd"]
    inputs = [f"in-{codec}-{uuid.uuid4().hex[:8]}" for codec in codecs]
    async with admin_client(bootstrap_servers=kafka_bootstrap) as admin:
        await admin.create_topics(
            [
                NewTopic(name, 1, 1, topic_configs={"compression.type": codec})
                for name, codec in zip(inputs, codecs, strict=True)
            ]
        )
        await ensure_topics(admin, {name: 1 for name in inputs})
    texts = [
        "harbour cranes unload grain ships before the autumn storms arrive",
        "a violinist rehearses scales in an empty concert hall at dawn",
        "volunteers count migrating cranes along the frozen river delta",
        "the bakery on fifth street sells out of rye bread by noon daily",
    ]
    stories = {codec: json.dumps({"text": text}).encode() for codec, text in zip(codecs, texts, strict=False)}
    for name, codec in zip(inputs, codecs, strict=False):
        await kafka_produce(name, [stories[codec], stories[codec]])
    settings = load_settings(None, **overrides(kafka_bootstrap, topics, tmp_path / "index", input_topics=inputs))

    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, 2 * len(codecs)), 60, "every compressed input to be read")

    output = await kafka_consume(topics.output, count=len(codecs))
    assert sorted(r.value for r in output) == sorted(stories.values())
    assert sorted(
        header(r, HEADER_MATCH_ID).decode() for r in await kafka_consume(topics.duplicates, count=len(codecs))
    ) == sorted(f"{name}-0-0" for name in inputs)


async def secured_topics(secured: SecuredKafka) -> Topics:
    """Topics on the secured broker, created through its open listener."""
    unique = uuid.uuid4().hex[:8]
    topics = Topics(f"in-{unique}", f"out-{unique}", f"dup-{unique}", f"dlq-{unique}")
    async with admin_client(bootstrap_servers=secured.plaintext) as admin:
        await ensure_topics(admin, {name: 1 for name in vars(topics).values()})
    return topics


def scram_security(secured: SecuredKafka, password: str) -> dict[str, Any]:
    return {
        "protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": SECURED_USER,
        "sasl_password": password,
        "ssl_cafile": str(secured.ca),
    }


async def test_the_service_publishes_exactly_once_over_sasl_and_tls(
    secured_kafka: SecuredKafka, tmp_path: Path
) -> None:
    topics = await secured_topics(secured_kafka)
    base = "a story that reaches the secured cluster twice and is published only once over tls"
    stream = [json.dumps({"text": text}).encode() for text in (base, "a different story about trains", base)]
    await produce_records(secured_kafka.plaintext, topics.input, stream)
    security = scram_security(secured_kafka, secured_kafka.passwords["SCRAM-SHA-512"])
    settings = load_settings(None, **overrides(secured_kafka.sasl_ssl, topics, tmp_path / "index", security=security))

    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, len(stream)), 60, "the stream to be processed over SASL_SSL")

    output = await consume_records(secured_kafka.plaintext, topics.output, count=2)
    assert [r.value for r in output] == stream[:2]
    duplicates = await consume_records(secured_kafka.plaintext, topics.duplicates, count=1)
    assert [(r.value, header(r, HEADER_MATCH_ID)) for r in duplicates] == [(stream[2], f"{topics.input}-0-0".encode())]
    assert await committed_offset(secured_kafka.plaintext, settings.kafka.group_id, topics.input) == len(stream)


async def test_a_service_refused_by_the_broker_retries_and_is_not_ready(
    secured_kafka: SecuredKafka, tmp_path: Path
) -> None:
    topics = await secured_topics(secured_kafka)
    await produce_records(
        secured_kafka.plaintext, topics.input, [json.dumps({"text": "waiting for credentials"}).encode()]
    )
    security = scram_security(secured_kafka, "not-the-password")
    refused = overrides(
        secured_kafka.sasl_ssl, topics, tmp_path / "index", security=security, retry_backoff_seconds=0.2
    )
    settings = load_settings(None, **{**refused, "metrics": {"enabled": True, "host": "127.0.0.1", "port": 0}})

    async with DedupService(settings) as service:
        await asyncio.sleep(3)
        assert service.running
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{service.health_port}/readyz") as response:
                assert response.status == 503
                assert (await response.json())["checks"] == {
                    "partitions_assigned": False,
                    "index_open": True,
                    "producer_ready": False,
                    "index_storing": True,
                }
        assert service.stats.consumed == 0
    assert await committed_offset(secured_kafka.plaintext, settings.kafka.group_id, topics.input) == 0


async def test_a_batch_signed_after_the_next_one_is_still_decided_before_it(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path
) -> None:
    # Two records a batch, two signing workers in turn: the first batch's ~800 kB text keeps its worker busy
    # long after the other has signed the second batch, whose first record copies the first batch's story.
    # Decided in the order signed, the copy would be published and the original dropped.
    rng = random.Random(7)
    long_text = " ".join(f"w{rng.randrange(10**6)}" for _ in range(100_000))
    story = "a ferry ran aground off the northern coast this morning and all passengers were rescued"
    stream = [
        OutRecord(json.dumps({"text": long_text}).encode(), key=b"long"),
        OutRecord(json.dumps({"text": story}).encode(), key=b"original"),
        OutRecord(json.dumps({"text": story}).encode(), key=b"copy"),
        OutRecord(
            json.dumps({"text": "the city council votes on the new cycling lanes next week"}).encode(), key=b"other"
        ),
    ]
    await kafka_produce(topics.input, stream)
    settings = load_settings(None, **overrides(kafka_bootstrap, topics, tmp_path / "index", batch_max_records=2))
    assert settings.dedup.workers == 2

    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, len(stream)), 60, "the stream to be processed")

    output = await kafka_consume(topics.output, count=3)
    assert [r.key for r in output] == [b"long", b"original", b"other"]
    (duplicate,) = await kafka_consume(topics.duplicates, count=1)
    assert duplicate.key == b"copy"
    assert header(duplicate, HEADER_MATCH_ID).decode() == f"{topics.input}-0-1"


async def test_an_index_behind_kafka_is_replayed_and_nothing_is_republished(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path
) -> None:
    # The index is restored from a copy taken 150 records ago: the service must put those records back into
    # it, publishing nothing, so that later copies of them are still dropped.
    stream = synthetic_stream(450, seed=7, bad_every=41)
    settings = load_settings(None, **overrides(kafka_bootstrap, topics, tmp_path / "index", batch_max_records=50))
    for part, copy_after in ((stream[:150], True), (stream[150:300], False)):
        await kafka_produce(topics.input, part)
        async with DedupService(settings) as service:
            await wait_for(lambda part=part: _consumed(service, len(part)), 90, "the part to be processed")
        if copy_after:
            shutil.copytree(tmp_path / "index", tmp_path / "backup")
    shutil.rmtree(tmp_path / "index")
    shutil.copytree(tmp_path / "backup", tmp_path / "index")
    await kafka_produce(topics.input, stream[300:])
    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, 150), 90, "the last part to be processed")
        assert service.stats.consumed == 150  # replayed records are not counted as consumed again

    expected = offline_novel(settings, tmp_path / "offline", stream, topics.input, batch=100)
    assert_same_output(await kafka_consume(topics.output, timeout=60), expected)
    with open_index(settings, tmp_path / "index") as index:
        assert index.source_offsets() == {(topics.input, 0): len(stream)}


async def _consumed(service: DedupService, n: int) -> bool:
    return service.stats.consumed >= n


async def test_every_dead_letter_reason_keeps_original_bytes_and_never_blocks_the_partition(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path
) -> None:
    good = [
        json.dumps({"body": {"text": f"good record number {i} " + " ".join(f"w{i}x{j}" for j in range(12))}})
        for i in range(4)
    ]
    bad = {
        "invalid_json": b'{"body": nope}',
        "missing_field": b'{"title": "no body here"}',
        "not_utf8": b'{"body": {"text": "caf\xe9"}}',
        "empty_text": b'{"body": {"text": "   "}}',
        "too_large": json.dumps({"body": {"text": "x" * 5000}}).encode(),
        "null_value": None,
    }
    stream = [OutRecord(good[0].encode(), key=b"g0")]
    for i, (reason, value) in enumerate(bad.items()):
        stream.append(OutRecord(value, key=reason.encode(), headers=(("trace", f"t{i}".encode()),)))
        if i % 2:
            stream.append(OutRecord(good[1 + i // 2].encode(), key=f"g{1 + i // 2}".encode()))
    settings = load_settings(
        None,
        **overrides(kafka_bootstrap, topics, tmp_path / "index"),
        input={"text_fields": ["body.text"], "max_message_bytes": 4096},
    )
    await kafka_produce(topics.input, stream)

    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, len(stream)), 60, "the stream to be processed")

    dead = await kafka_consume(topics.dead_letters, count=len(bad))
    assert [(header(r, HEADER_DEAD_LETTER_REASON).decode(), r.key, r.value) for r in dead] == [
        (reason, reason.encode(), value) for reason, value in bad.items()
    ]
    assert [[h for h in r.headers if h[0] == "trace"] for r in dead] == [
        [("trace", f"t{i}".encode())] for i in range(6)
    ]
    assert all(header(r, HEADER_DEAD_LETTER_DETAIL) for r in dead)
    output = await kafka_consume(topics.output, count=4)
    assert [r.value for r in output] == [g.encode() for g in good]
    assert dict(service.stats.dead_lettered) == dict.fromkeys(bad, 1)


async def test_a_record_with_neither_key_nor_value_is_dead_lettered_as_it_came(
    kafka_bootstrap: str, topics: Topics, kafka_consume: Any, tmp_path: Path
) -> None:
    # Kafka takes such a record from any client; aiokafka's send refuses to make one, its batch API does not.
    good = json.dumps({"text": "a story that comes right after a record with nothing in it at all"}).encode()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        stream = [OutgoingRecord(topics.input, None, None, ()), OutgoingRecord(topics.input, good, None, ())]
        await asyncio.gather(*await send_batched(producer, stream, 1_048_576))
    finally:
        await producer.stop()
    settings = load_settings(None, **overrides(kafka_bootstrap, topics, tmp_path / "index"))

    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, 2), 60, "the stream to be processed")

    dead = await kafka_consume(topics.dead_letters, count=1)
    assert [(r.key, r.value, header(r, HEADER_DEAD_LETTER_REASON)) for r in dead] == [(None, None, b"null_value")]
    assert [r.value for r in await kafka_consume(topics.output, count=1)] == [good]
    assert await committed_offset(kafka_bootstrap, settings.kafka.group_id, topics.input) == 2


async def test_an_id_with_a_lone_surrogate_is_dead_lettered_and_the_stream_goes_on(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path
) -> None:
    # JSON may spell a lone surrogate (\ud800); no UTF-8 holds it, so the index cannot store the id. Before the
    # decoder refused it, it failed its whole batch in the decision core, and the replay failed again.
    stream = [
        OutRecord(b'{"id": "a", "text": "the first record of this little stream"}'),
        OutRecord(b'{"id": "half \\ud83d", "text": "a record with a broken id"}', key=b"poison"),
        OutRecord(b'{"id": "c", "text": "the third record, after the broken one"}'),
    ]
    settings = load_settings(None, **overrides(kafka_bootstrap, topics, tmp_path / "index"), input={"id_field": "id"})
    await kafka_produce(topics.input, stream)

    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, len(stream)), 60, "the stream to be processed")
        assert service.running

    dead = await kafka_consume(topics.dead_letters, count=1)
    assert [(header(r, HEADER_DEAD_LETTER_REASON), r.key, r.value) for r in dead] == [
        (b"not_utf8", b"poison", stream[1].value)
    ]
    assert b"lone surrogate" in header(dead[0], HEADER_DEAD_LETTER_DETAIL)
    output = await kafka_consume(topics.output, count=2)
    assert [r.value for r in output] == [stream[0].value, stream[2].value]
    assert (service.stats.published, dict(service.stats.dead_lettered)) == (2, {"not_utf8": 1})


@pytest.fixture
def expiry_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The service expires its index before every batch, not every few seconds."""
    monkeypatch.setattr("streamdedup.service.batch_pipeline._INDEX_STATS_INTERVAL_SECONDS", 0.0)


@pytest.mark.usefixtures("expiry_every_batch")
async def test_a_record_stamped_years_ahead_does_not_expire_the_index(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path
) -> None:
    # A clock that followed the newest event time would jump ten years with the third record and drop
    # everything stored before it: the copy at the end would pass as novel.
    now = time.time()

    def record(text: str, stamp: float) -> OutRecord:
        return OutRecord(json.dumps({"text": text, "ts": stamp}).encode())

    first = [
        record("an ordinary record about the harbour and its boats", now),
        record("another ordinary record about the market square", now + 1),
        record("a record whose producer clock is ten years ahead", now + 10 * 365 * 86400),
        record("a third ordinary record about the railway station", now + 2),
    ]
    config = overrides(kafka_bootstrap, topics, tmp_path / "index")
    config["index"]["max_age_seconds"] = 3600
    settings = load_settings(None, **config, input={"time_field": "ts"})
    await kafka_produce(topics.input, first)
    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, len(first)), 60, "the first records to be processed")
        await kafka_produce(topics.input, [record("an ordinary record about the harbour and its boats", now + 3)])
        await wait_for(lambda: _consumed(service, len(first) + 1), 60, "the copy to be processed")
    output = await kafka_consume(topics.output, count=len(first))
    assert [r.value for r in output] == [r.value for r in first]
    assert (service.stats.published, dict(service.stats.dropped)) == (4, {"exact": 1})


async def test_a_document_that_breaks_the_decision_core_is_dead_lettered_and_the_stream_goes_on(
    kafka_bootstrap: str,
    topics: Topics,
    kafka_produce: Any,
    kafka_consume: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A bug one record sets off in the decision core (here planted in its lookup, which runs in this process
    # with no workers) used to fail the batch on every replay: the service stopped for good.
    plant_decision_bug(monkeypatch, "poison", "a bug this record sets off")
    texts = ["a record about the harbour and its fishing boats", "the poison record", "a record about the old mill"]
    stream = [
        OutRecord(json.dumps({"id": name, "text": text}).encode())
        for name, text in zip(["a", "poison", "c"], texts, strict=True)
    ]
    stream.append(OutRecord(json.dumps({"id": "copy", "text": texts[0]}).encode()))
    settings = load_settings(
        None, **overrides(kafka_bootstrap, topics, tmp_path / "index"), input={"id_field": "id"}, dedup={"workers": 0}
    )
    await kafka_produce(topics.input, stream)
    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, len(stream)), 60, "the stream to be processed")
        assert service.running
    output = await kafka_consume(topics.output, count=2)
    assert [r.value for r in output] == [stream[0].value, stream[2].value]
    (dead,) = await kafka_consume(topics.dead_letters, count=1)
    assert (dead.value, header(dead, HEADER_DEAD_LETTER_REASON), header(dead, HEADER_DEAD_LETTER_ERROR)) == (
        stream[1].value,
        b"decide_error",
        b"ZeroDivisionError",
    )
    assert b"a bug this record sets off" in header(dead, HEADER_DEAD_LETTER_DETAIL)
    assert (service.stats.published, dict(service.stats.dropped)) == (2, {"exact": 1})
    assert dict(service.stats.dead_lettered) == {"decide_error": 1}


async def produce_unparsable(bootstrap: str, topic: str, value: bytes) -> None:
    """A record whose header key is not UTF-8: Kafka stores it, aiokafka cannot parse it. aiokafka's producer
    only writes str keys, so the built batch is patched (and its CRC computed again) before it is sent."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False)
    await producer.start()
    try:
        batch = producer.create_batch()
        key, placeholder = b"caf\xe9", "\x01" * 4
        batch.append(key=None, value=value, timestamp=None, headers=[(placeholder, b"v")])
        buffer = batch._build()
        at = buffer.index(placeholder.encode())
        buffer[at : at + len(key)] = key
        struct.pack_into(">I", buffer, 17, calc_crc32c(bytes(buffer[21:])))  # the CRC covers from the attributes on
        await (await producer.send_batch(batch, topic, partition=0))
    finally:
        await producer.stop()


async def test_records_that_raise_or_cannot_be_parsed_are_dead_lettered_and_the_stream_goes_on(
    kafka_bootstrap: str,
    topics: Topics,
    kafka_produce: Any,
    kafka_consume: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each of these stopped `streamdedup run`, and again after every restart: the partition was stuck for good.
    plant_signing_bug(monkeypatch, "poisonword", "a bug this text sets off")
    monkeypatch.setattr(dedup_service, "_DEAD_LETTER_LOG_SECONDS", 3600.0)
    now = int(time.time())

    def doc(text: str) -> bytes:
        return json.dumps({"text": text, "ts": now}).encode()

    good = [doc(f"an ordinary record number {i} about " + " ".join(f"w{i}x{j}" for j in range(10))) for i in range(4)]
    huge_integer = b'{"text": "a record with a very long number", "ts": %d, "n": %s}' % (now, b"9" * 5000)
    huge_time = b'{"text": "a record with a very long time", "ts": %s}' % (b"9" * 400)
    await kafka_produce(
        topics.input, [good[0], OutRecord(huge_integer, key=b"int"), good[1], OutRecord(huge_time, key=b"time")]
    )
    await produce_unparsable(kafka_bootstrap, topics.input, doc("a record whose header the client cannot read"))
    await kafka_produce(topics.input, [OutRecord(doc("a poisonword breaks signing"), key=b"sign"), good[2], good[3]])
    settings = load_settings(
        None, **overrides(kafka_bootstrap, topics, tmp_path / "index"), input={"time_field": "ts"}, dedup={"workers": 0}
    )

    with caplog.at_level(logging.WARNING, logger="streamdedup.service"):
        async with DedupService(settings) as service:
            await wait_for(lambda: _consumed(service, 8), 60, "the stream to be processed")
            assert service.running

    dead = await kafka_consume(topics.dead_letters, count=4)
    assert [
        (
            r.key,
            header(r, HEADER_DEAD_LETTER_REASON),
            header(r, HEADER_DEAD_LETTER_ERROR),
            header(r, HEADER_SOURCE_OFFSET),
        )
        for r in dead
    ] == [
        (b"int", b"decode_error", b"ValueError", b"1"),
        (b"time", b"decode_error", b"OverflowError", b"3"),
        (None, b"unreadable_record", b"UnicodeDecodeError", b"4"),
        (b"sign", b"sign_error", b"ZeroDivisionError", b"5"),
    ]
    assert [dead[0].value, dead[1].value, dead[2].value] == [huge_integer, huge_time, None]
    assert (header(dead[2], HEADER_SOURCE_TOPIC), header(dead[2], HEADER_SOURCE_PARTITION)) == (
        topics.input.encode(),
        b"0",
    )
    assert b"Exceeds the limit" in header(dead[0], HEADER_DEAD_LETTER_DETAIL)
    output = await kafka_consume(topics.output, count=4)
    assert [r.value for r in output] == good
    reasons = {"decode_error": 2, "unreadable_record": 1, "sign_error": 1}
    assert (service.stats.published, dict(service.stats.dead_lettered)) == (4, reasons)
    for reason, count in reasons.items():
        assert (
            service.metrics.registry.get_sample_value("streamdedup_messages_dead_lettered_total", {"reason": reason})
            == count
        )
    assert await committed_offset(kafka_bootstrap, settings.kafka.group_id, topics.input) == 8
    # One line for the interval, not one per dead letter.
    summaries = [r.getMessage() for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert len(summaries) == 1 and summaries[0].startswith("dead-lettered 4 records in the last"), summaries
    assert all(f"{count} {reason}" in summaries[0] for reason, count in reasons.items())


@pytest.mark.parametrize(("max_message_bytes", "reason"), [(1_000_000, b"too_large"), (3_000_000, b"output_too_large")])
async def test_a_record_larger_than_its_topics_take_is_dead_lettered_cut_to_fit(
    kafka_bootstrap: str,
    topics: Topics,
    kafka_produce: Any,
    kafka_consume: Any,
    tmp_path: Path,
    max_message_bytes: int,
    reason: bytes,
) -> None:
    # The input topic takes 4 MB records, the output and dead-letter topics Kafka's default 1 MB: the dead
    # letter of a 2 MB record (too large to read, or to publish) was refused by the broker and retried for ever.
    big_input = f"in-big-{uuid.uuid4().hex[:8]}"
    async with admin_client(bootstrap_servers=kafka_bootstrap) as admin:
        await admin.create_topics([NewTopic(big_input, 1, 1, topic_configs={"max.message.bytes": str(4 << 20)})])
        await ensure_topics(admin, {big_input: 1})
    words = " ".join(f"w{i}" for i in range(300_000))
    big = OutRecord(json.dumps({"text": words}).encode(), key=b"big", headers=(("trace", b"t1"),))
    assert 2_000_000 < len(big.value or b"") < 3_000_000
    texts = ["fishing boats leave the harbour before dawn", "the old mill by the river grinds rye again"]
    good = [json.dumps({"text": text}).encode() for text in texts]
    stream = [big, OutRecord(good[0]), OutRecord(good[1]), big]
    await kafka_produce(big_input, stream, max_request_size=4 << 20)
    settings = load_settings(
        None,
        **overrides(kafka_bootstrap, topics, tmp_path / "index", input_topics=[big_input]),
        input={"max_message_bytes": max_message_bytes},
    )

    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, len(stream)), 90, "the stream to be processed")
        assert service.running

    assert [r.value for r in await kafka_consume(topics.output, count=2)] == good
    dead = await kafka_consume(topics.dead_letters, count=2)
    for letter, offset in zip(dead, (b"0", b"3"), strict=True):
        assert (letter.key, header(letter, HEADER_DEAD_LETTER_REASON), header(letter, "trace")) == (
            b"big",
            reason,
            b"t1",
        )
        assert (header(letter, HEADER_SOURCE_TOPIC), header(letter, HEADER_SOURCE_OFFSET)) == (
            big_input.encode(),
            offset,
        )
        assert int(header(letter, HEADER_DEAD_LETTER_TRUNCATED)) > len(big.value or b"")
        assert 900_000 < len(letter.value or b"") < 1_048_588 and (big.value or b"").startswith(letter.value or b"x")
    # The big record never entered the index: its copy is dead-lettered too, not dropped as a duplicate.
    assert (service.stats.published, dict(service.stats.dropped), dict(service.stats.dead_lettered)) == (
        2,
        {},
        {reason.decode(): 2},
    )
    assert await committed_offset(kafka_bootstrap, settings.kafka.group_id, big_input) == len(stream)


async def test_a_new_group_id_resumes_where_the_index_is_and_publishes_nothing_again(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path
) -> None:
    # Kafka forgets a group's offsets when the group id changes, the group is deleted or its offsets expire
    # (offsets.retention.minutes): the index, which holds its own, must not be rolled back and republished.
    stream = synthetic_stream(50, seed=11)
    await kafka_produce(topics.input, stream)
    first = load_settings(None, **overrides(kafka_bootstrap, topics, tmp_path / "index"))
    async with DedupService(first) as service:
        await wait_for(lambda: _consumed(service, len(stream)), 60, "the stream to be processed")
    published = len(await kafka_consume(topics.output))
    assert 20 < published < 50

    second = load_settings(None, **overrides(kafka_bootstrap, topics, tmp_path / "index"))
    assert second.kafka.group_id != first.kafka.group_id
    late = json.dumps({"text": "one story that arrives after the group changed"}).encode()
    async with DedupService(second) as service:
        await kafka_produce(topics.input, [late])
        await wait_for(lambda: _consumed(service, 1), 60, "the new record to be processed")
        await asyncio.sleep(1)  # anything republished would be on its way by now
        assert (service.stats.consumed, service.stats.published) == (1, 1)

    output = await kafka_consume(topics.output)
    assert len(output) == published + 1 and output[-1].value == late
    assert await committed_offset(kafka_bootstrap, second.kafka.group_id, topics.input) == len(stream) + 1
    with open_index(second, tmp_path / "index") as index:
        assert index.source_offsets() == {(topics.input, 0): len(stream) + 1}
        assert index.usage()["entries"] == published + 1


async def test_a_first_batch_decided_but_never_committed_to_kafka_is_published_after_a_restart(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path
) -> None:
    # An instance killed between its index's commit and its group's first Kafka transaction leaves an index ahead
    # of a group without offsets: what a new group id looks like too. The service commits where it resumes
    # before deciding anything, so Kafka has an offset from the start and the batch is rolled back.
    settings = load_settings(None, **overrides(kafka_bootstrap, topics, tmp_path / "index"))

    def committed() -> Awaitable[int | None]:
        return kafka_committed(kafka_bootstrap, settings.kafka.group_id, topics.input)

    async with DedupService(settings):
        await wait_for(lambda: _is(committed(), 0), 60, "the resume offset to be committed")
    stream = synthetic_stream(40, seed=17)
    await kafka_produce(topics.input, stream)
    documents = [doc for _, doc in stream_documents(settings, stream, topics.input)]
    with open_index(settings, tmp_path / "index") as index:
        Deduplicator(settings, index).decide(documents, source_offsets={(topics.input, 0): len(stream)})

    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, len(stream)), 60, "the batch to be decided again")
    expected = offline_novel(settings, tmp_path / "offline", stream, topics.input, batch=100)
    assert len(expected) > 20
    assert_same_output(await kafka_consume(topics.output, timeout=60), expected)
    assert await committed() == len(stream)


async def _is(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


async def test_an_upstream_redelivery_under_the_same_id_is_dropped_across_batches(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path
) -> None:
    # A producer that retries without idempotence sends a record again at a new offset, its text sometimes
    # rewritten on the way (a refreshed feed item): with input.id_field the id says it is the same document.
    first = [
        OutRecord(b'{"id": "a", "text": "a storm closes the harbour for the whole weekend"}'),
        OutRecord(b'{"id": "b", "text": "the council votes on the new cycling lanes tonight"}'),
    ]
    again = [
        OutRecord(b'{"id": "a", "text": "UPDATED: harbour reopens on Monday morning after the storm"}'),
        OutRecord(b'{"id": "c", "text": "a bakery wins the regional bread prize for a third year"}'),
        OutRecord(b'{"id": "c", "text": "a bakery wins the regional bread prize for a third year"}'),
    ]
    settings = load_settings(None, **overrides(kafka_bootstrap, topics, tmp_path / "index"), input={"id_field": "id"})
    async with DedupService(settings) as service:
        await kafka_produce(topics.input, first)
        await wait_for(lambda: _consumed(service, len(first)), 60, "the first records to be processed")
        await kafka_produce(topics.input, again)
        await wait_for(lambda: _consumed(service, len(first) + len(again)), 60, "the redeliveries to be processed")

    output = await kafka_consume(topics.output, count=3)
    assert [r.value for r in output] == [first[0].value, first[1].value, again[1].value]
    duplicates = await kafka_consume(topics.duplicates, count=2)
    assert [(r.value, header(r, HEADER_MATCH_REASON), header(r, HEADER_MATCH_ID)) for r in duplicates] == [
        (again[0].value, b"redelivered", b"a"),
        (again[2].value, b"redelivered", b"c"),
    ]


@pytest.mark.usefixtures("expiry_every_batch")
async def test_a_burst_of_times_in_milliseconds_does_not_expire_the_index(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path
) -> None:
    # 600 records stamped in milliseconds would move the expiry clock (the median of the latest event times)
    # a thousandfold ahead and expire every entry: the copy of X a few seconds after X would be published.
    now = time.time()
    burst = [
        OutRecord(json.dumps({"text": " ".join(uuid.uuid4().hex[:12] for _ in range(8)), "ts": now * 1000}).encode())
        for _ in range(600)
    ]
    x = "the record X that arrives after the burst and again a few seconds later"
    config = overrides(kafka_bootstrap, topics, tmp_path / "index", batch_max_records=200)
    config["index"]["max_age_seconds"] = 3600
    settings = load_settings(None, **config, input={"time_field": "ts"})
    await kafka_produce(topics.input, [*burst, OutRecord(json.dumps({"text": x, "ts": now}).encode())])
    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, len(burst) + 1), 90, "the burst and X to be processed")
        await kafka_produce(topics.input, [OutRecord(json.dumps({"text": x, "ts": now + 3}).encode())])
        await wait_for(lambda: _consumed(service, len(burst) + 2), 60, "the copy of X to be processed")
        clamped = service.metrics.registry.get_sample_value("streamdedup_event_times_clamped_total")

    assert (service.stats.published, dict(service.stats.dropped)) == (len(burst) + 1, {"exact": 1})
    assert clamped == len(burst)
    (duplicate,) = await kafka_consume(topics.duplicates, count=1)
    assert json.loads(duplicate.value)["text"] == x


# ---------------------------------------------------------------------------------------------- processes


def start_service(config: Path, log_path: Path, *, own_group: bool = False) -> subprocess.Popen[bytes]:
    """``streamdedup run``; ``own_group`` puts it (and the workers it spawns) in a process group of its own."""
    with log_path.open("ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [str(STREAMDEDUP), "--config", str(config), "run"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=own_group,
        )


@pytest.mark.parametrize("stop", ["SIGTERM to the service", "SIGINT to its process group (Ctrl-C)"])
async def test_sigterm_or_ctrl_c_finishes_the_batch_commits_and_closes_the_index(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path, stop: str
) -> None:
    stream = synthetic_stream(3000, seed=7)
    await kafka_produce(topics.input, stream)
    config_dict = overrides(kafka_bootstrap, topics, tmp_path / "index", batch_max_records=50)
    config = write_config(tmp_path / "config.yaml", config_dict)
    group = config_dict["kafka"]["group_id"]
    ctrl_c = stop.startswith("SIGINT")
    process = start_service(config, tmp_path / "service.log", own_group=ctrl_c)
    try:
        await wait_for(
            lambda: _progress(kafka_bootstrap, group, topics.input, 200), 60, "the service to commit some batches"
        )
        if ctrl_c:
            # A terminal sends Ctrl-C to every process of the group, the worker processes too.
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 30) == 0
    finally:
        process.kill()
    committed = await committed_offset(kafka_bootstrap, group, topics.input)
    assert 200 <= committed <= len(stream)
    settings = load_settings(config)
    # The index closed cleanly, agrees with Kafka, and holds exactly what the output holds.
    with open_index(settings, Path(config_dict["index"]["path"])) as index:
        assert index.source_offsets() == {(topics.input, 0): committed}
        stored = len(index)
    expected = offline_novel(settings, tmp_path / "offline", stream[:committed], topics.input, batch=333)
    output = await kafka_consume(topics.output)
    assert_same_output(output, expected)
    assert stored == len(expected)
    log = (tmp_path / "service.log").read_text()
    assert "stopped" in log


async def _progress(bootstrap: str, group: str, topic: str, at_least: int) -> bool:
    return await committed_offset(bootstrap, group, topic) >= at_least


async def test_second_instance_in_the_group_is_detected_and_nothing_is_split(
    kafka_bootstrap: str,
    topic_factory: Any,
    kafka_produce: Any,
    kafka_consume: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topics = Topics(
        input=await topic_factory(2, prefix="in"),
        output=await topic_factory(1, prefix="out"),
        duplicates=await topic_factory(1, prefix="dup"),
        dead_letters=await topic_factory(1, prefix="dlq"),
    )
    config_dict = overrides(kafka_bootstrap, topics, tmp_path / "first")
    first = load_settings(None, **config_dict)
    second_dict = json.loads(json.dumps(config_dict))
    second_dict["index"]["path"] = str(tmp_path / "second")
    second_dict["kafka"]["transactional_id"] += "-second"
    second_config = write_config(tmp_path / "second.yaml", second_dict)
    records = [
        OutRecord(
            json.dumps({"text": f"story {i} " + " ".join(f"t{i}w{j}" for j in range(10))}).encode(), partition=i % 2
        )
        for i in range(40)
    ]

    async with DedupService(first) as service:
        await kafka_produce(topics.input, records[:20])
        await wait_for(lambda: _consumed(service, 20), 60, "the first instance to process the first half")
        second = start_service(second_config, tmp_path / "second.log")
        try:
            await wait_for(
                lambda: _logged(tmp_path / "second.log", "ANOTHER INSTANCE"), 60, "the second instance to notice"
            )
            await kafka_produce(topics.input, records[20:])
            await asyncio.sleep(3)
            # While split, neither instance processes anything: the output holds only the first half.
            assert service.stats.consumed == 20
            assert len(await kafka_consume(topics.output)) == 20
        finally:
            second.send_signal(signal.SIGTERM)
            await asyncio.to_thread(second.wait, 30)
        # Alone again, the first instance takes everything back and finishes the stream.
        await wait_for(lambda: _consumed(service, 40), 60, "the first instance to take over again")
    output = await kafka_consume(topics.output)
    assert sorted(r.value for r in output) == sorted(r.value for r in records)
    assert "ANOTHER INSTANCE" in caplog.text


async def _logged(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text(errors="replace")


# ---------------------------------------------------------------------------------------------- exactly once


@pytest.mark.slow
async def test_kill_minus_9_twenty_times_mid_stream_publishes_exactly_the_offline_result(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path
) -> None:
    total, kills = 50_000, 20
    stream = synthetic_stream(total, seed=11, bad_every=997)
    await kafka_produce(topics.input, stream)
    config_dict = overrides(
        kafka_bootstrap, topics, tmp_path / "index", batch_max_records=100, group_instance_id="crash-test"
    )
    # Expiry removes entries all through the stream (its event times span 50,000 seconds), and so does
    # max_entries (below the 6,000-7,000 entries expiry leaves): rolled-back batches restore what they removed,
    # and what a document sees does not depend on where batches were cut (1,000 offline, 100 here).
    config_dict["index"].update(max_age_seconds=7200.0, time_bucket_seconds=600.0, max_entries=3000)
    config = write_config(tmp_path / "config.yaml", config_dict)
    group = config_dict["kafka"]["group_id"]
    rng = random.Random(2024)
    # Each life is killed once it has committed a random number of records past where it started, after a
    # further random delay of up to a few batches: every kill lands while most of the stream still waits, at a
    # random moment of a batch (deciding, inside the LMDB transaction, producing, committing, or between them).
    # The commits are watched every 20 ms by one consumer of the group that never joins it, so that a life runs
    # little past its target however fast the service is.
    progress = [0]
    watcher = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False)
    await watcher.start()
    try:
        for kill in range(kills):
            process = start_service(config, tmp_path / "service.log")
            try:
                target = progress[-1] + rng.randint(100, 1200)
                deadline = time.monotonic() + 120
                while (await watcher.committed(TopicPartition(topics.input, 0)) or 0) < target:
                    assert time.monotonic() < deadline, f"life {kill} did not pass {target} in 120 s"
                    await asyncio.sleep(0.02)
                await asyncio.sleep(rng.uniform(0.0, 0.05))
            finally:
                process.send_signal(signal.SIGKILL)
                await asyncio.to_thread(process.wait, 30)
            progress.append(await watcher.committed(TopicPartition(topics.input, 0)) or 0)
    finally:
        await watcher.stop()
    assert progress == sorted(set(progress)) and progress[-1] < total, progress

    process = start_service(config, tmp_path / "service.log")
    try:
        await wait_for(lambda: _progress(kafka_bootstrap, group, topics.input, total), 240, "the stream to finish")
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, 30)

    settings = load_settings(config)
    expected = offline_novel(settings, tmp_path / "offline", stream, topics.input, batch=1000)
    output = await kafka_consume(topics.output, timeout=120)
    assert_same_output(output, expected)
    dead = await kafka_consume(topics.dead_letters, timeout=60)
    assert [int(header(r, HEADER_SOURCE_OFFSET)) for r in dead] == list(range(996, total, 997))


@pytest.mark.slow
async def test_broker_down_for_30_seconds_mid_stream_recovers_with_the_same_result(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "broker")
    bootstrap = await asyncio.to_thread(broker.start)
    try:
        await _outage_run(bootstrap, broker, tmp_path)
    finally:
        await asyncio.to_thread(broker.stop)


async def _outage_run(bootstrap: str, broker: LocalBroker, tmp_path: Path) -> None:
    unique = uuid.uuid4().hex[:6]
    topics = Topics(f"in-{unique}", f"out-{unique}", f"dup-{unique}", f"dlq-{unique}")
    async with admin_client(bootstrap_servers=bootstrap) as admin:
        await ensure_topics(admin, {name: 1 for name in vars(topics).values()})
    total = 20_000
    stream = synthetic_stream(total, seed=5, bad_every=1499)
    await produce_records(bootstrap, topics.input, stream)
    config_dict = overrides(
        bootstrap,
        topics,
        tmp_path / "index",
        batch_max_records=100,
        transaction_timeout_ms=15_000,
        request_timeout_ms=10_000,
        retry_backoff_max_seconds=5.0,
    )
    config = write_config(tmp_path / "config.yaml", config_dict)
    group = config_dict["kafka"]["group_id"]
    process = start_service(config, tmp_path / "service.log")
    try:
        await wait_for(lambda: _progress(bootstrap, group, topics.input, 2000), 120, "progress before the outage")
        await asyncio.to_thread(broker.stop)
        await asyncio.sleep(30)
        assert process.poll() is None, "the service must survive the outage"
        await asyncio.to_thread(broker.start)
        await wait_for(
            lambda: _progress(bootstrap, group, topics.input, total), 300, "recovery and the rest of the stream"
        )
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, 30)
    settings = load_settings(config)
    expected = offline_novel(settings, tmp_path / "offline", stream, topics.input, batch=777)
    output = await consume_records(bootstrap, topics.output, timeout=120)
    assert_same_output(output, expected)
    dead = await consume_records(bootstrap, topics.dead_letters)
    assert [int(header(r, HEADER_SOURCE_OFFSET)) for r in dead] == list(range(1498, total, 1499))


def worker_children(pid: int) -> list[int]:
    """The service's worker processes (signing and deciding; not multiprocessing's resource tracker)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    workers = []
    for child in children.read_text().split() if children.exists() else []:
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"spawn_main" in command and process_running(int(child)):
            workers.append(int(child))
    return workers


@pytest.mark.slow
async def test_killed_worker_processes_are_replaced_with_the_same_result(
    kafka_bootstrap: str, topics: Topics, kafka_produce: Any, kafka_consume: Any, tmp_path: Path
) -> None:
    total, kills = 20_000, 6
    stream = synthetic_stream(total, seed=23, bad_every=1999)
    chunk = total // (kills + 2)
    config_dict = overrides(kafka_bootstrap, topics, tmp_path / "index", batch_max_records=200)
    config = write_config(tmp_path / "config.yaml", config_dict)
    group = config_dict["kafka"]["group_id"]
    workers = load_settings(config).dedup.workers
    rng = random.Random(7)
    log_path = tmp_path / "service.log"
    await kafka_produce(topics.input, stream[:chunk])
    process = start_service(config, log_path)
    killed = []
    try:
        for kill in range(kills):
            produced = (kill + 1) * chunk
            await wait_for(
                lambda produced=produced: _progress(kafka_bootstrap, group, topics.input, produced),
                120,
                f"progress to {produced}",
            )
            # Fed in chunks, so that some kills land while the service works and some while it waits for input
            # (a dead worker is replaced either way). Kill again only once every worker is back and new signers
            # are ready.
            await kafka_produce(topics.input, stream[produced : produced + chunk])
            await wait_for(lambda: _workers_back(process.pid, workers + 1, log_path), 60, "the workers to be back")
            children = worker_children(process.pid)
            victim = rng.choice(children)
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
        await kafka_produce(topics.input, stream[(kills + 1) * chunk :])
        await wait_for(lambda: _progress(kafka_bootstrap, group, topics.input, total), 240, "the stream to finish")
        assert process.poll() is None, "the service must outlive its workers"
        assert not set(killed) & set(worker_children(process.pid))
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, 30)
    log = log_path.read_text(errors="replace")
    assert "died" in log
    settings = load_settings(config)
    expected = offline_novel(settings, tmp_path / "offline", stream, topics.input, batch=500)
    assert_same_output(await kafka_consume(topics.output, timeout=120), expected)


async def _workers_back(pid: int, expected: int, log_path: Path) -> bool:
    """All of the service's worker processes run and every signer pool started after a death is ready."""
    log = log_path.read_text(errors="replace")
    replaced = log.count("a signing worker died")
    return len(worker_children(pid)) == expected and log.count("signing workers ready") == replaced + 1


async def test_a_dead_signing_worker_is_replaced_and_a_refused_start_is_retried_after_a_pause(
    kafka_bootstrap: str,
    topics: Topics,
    kafka_produce: Any,
    kafka_consume: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    constructed: list[float] = []
    pools: list[CountingSignerPool] = []

    class CountingSignerPool(SignerPool):
        """Real workers that count the texts they are given; the second and third pools are refused, as by a
        host that has run out of processes."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            constructed.append(time.monotonic())
            if len(constructed) in (2, 3):
                raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
            super().__init__(*args, **kwargs)
            self.texts = 0
            pools.append(self)

        def submit(self, texts: Sequence[str]) -> Future[Signatures]:
            self.texts += len(texts)
            return super().submit(texts)

    monkeypatch.setattr(signer_supervisor, "SignerPool", CountingSignerPool)
    caplog.set_level(logging.INFO, logger=service_module.__name__)
    stream = synthetic_stream(3000, seed=31)
    settings = load_settings(None, **overrides(kafka_bootstrap, topics, tmp_path / "index", batch_max_records=100))

    def logged(text: str) -> int:
        return sum(text in record.getMessage() for record in caplog.records)

    async with DedupService(settings) as service:
        await kafka_produce(topics.input, stream[:1000])
        await wait_for(lambda: _consumed(service, 1000), 60, "the first thousand")
        os.kill(pools[0].pids[0], signal.SIGKILL)
        # The decision process signs the batches while new workers are refused twice.
        await kafka_produce(topics.input, stream[1000:2000])
        await wait_for(lambda: _consumed(service, 2000), 60, "the second thousand")
        await wait_for(lambda: _async_true(logged("signing workers ready") == 2), 30, "new signing workers")
        texts_before = pools[1].texts
        await kafka_produce(topics.input, stream[2000:])
        await wait_for(lambda: _consumed(service, 3000), 60, "the last thousand")
        deaths = _worker_deaths(service)

    assert len(constructed) == 4 and len(pools) == 2
    # Refused right after the death, then after a pause of one second and one of two.
    assert constructed[2] - constructed[1] >= 1.0 and constructed[3] - constructed[2] >= 2.0
    assert logged("new signing workers did not start") == 2
    assert deaths == {"signer": 1.0, "decision": 0.0}
    assert pools[1].texts - texts_before == 1000  # every text after the new workers were ready went to them
    expected = offline_novel(settings, tmp_path / "offline", stream, topics.input, batch=100)
    assert_same_output(await kafka_consume(topics.output, timeout=60), expected)


async def test_a_decision_process_killed_while_the_input_is_idle_is_replaced_without_waiting_for_a_batch(
    kafka_bootstrap: str,
    topics: Topics,
    kafka_produce: Any,
    kafka_consume: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    processes: list[DecisionProcess] = []

    class RecordedDecisionProcess(DecisionProcess):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            processes.append(self)

    monkeypatch.setattr(dedup_service, "DecisionProcess", RecordedDecisionProcess)
    caplog.set_level(logging.INFO, logger=service_module.__name__)
    stream = synthetic_stream(2000, seed=37)
    config = overrides(kafka_bootstrap, topics, tmp_path / "index", batch_max_records=100)
    settings = load_settings(None, **{**config, "metrics": {"enabled": True, "host": "127.0.0.1", "port": 0}})
    seen: list[bool] = []

    async with DedupService(settings) as service, aiohttp.ClientSession() as session:

        async def watch_readiness() -> None:
            while True:
                async with session.get(f"http://127.0.0.1:{service.health_port}/readyz") as response:
                    seen.append((await response.json())["checks"]["index_open"])
                await asyncio.sleep(0.02)

        await kafka_produce(topics.input, stream[:1000])
        await wait_for(lambda: _consumed(service, 1000), 60, "the first thousand")
        [decisions] = processes
        killed = decisions.pid
        assert killed is not None
        watcher = asyncio.create_task(watch_readiness())
        try:
            await wait_for(lambda: _async_true(bool(seen)), 10, "a first readiness check")
            os.kill(killed, signal.SIGKILL)
            # Nothing more is produced: the death is found between polls, not by the next batch.
            await wait_for(lambda: _async_true(False in seen), 10, "the readiness check to report the index closed")
            await wait_for(
                lambda: _async_true(decisions.open and decisions.pid != killed and seen[-1]),
                60,
                "a new decision process",
            )
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        assert service.stats.consumed == 1000
        await kafka_produce(topics.input, stream[1000:])
        await wait_for(lambda: _consumed(service, 2000), 60, "the second thousand")
        deaths = _worker_deaths(service)

    assert seen[0] is True and seen.index(False) > 0 and seen[-1] is True
    assert deaths == {"signer": 0.0, "decision": 1.0}
    assert sum("died while the input was idle" in record.getMessage() for record in caplog.records) == 1
    expected = offline_novel(settings, tmp_path / "offline", stream, topics.input, batch=100)
    assert_same_output(await kafka_consume(topics.output, timeout=60), expected)


def quick_retries(bootstrap: str, topics: Topics, index_path: Path, **kafka: Any) -> dict[str, Any]:
    """:func:`overrides` with pauses of 0.2 s doubling up to 0.8 s between retries, so a test sees several."""
    return overrides(bootstrap, topics, index_path, retry_backoff_seconds=0.2, retry_backoff_max_seconds=0.8, **kafka)


def _sample(service: DedupService, name: str, **labels: str) -> float | None:
    return service.metrics.registry.get_sample_value(name, labels)


def _logged_pauses(caplog: pytest.LogCaptureFixture, pattern: str) -> list[float]:
    """The pauses, in seconds, of the service's log lines matching ``pattern`` (a group around the number)."""
    return [float(m.group(1)) for record in caplog.records if (m := re.search(pattern, record.getMessage()))]


async def _readyz(session: aiohttp.ClientSession, service: DedupService) -> tuple[int, dict[str, Any]]:
    async with session.get(f"http://127.0.0.1:{service.health_port}/readyz") as response:
        return response.status, await response.json()


def _storage_failing(service: DedupService) -> Any:
    return lambda: _async_true(_sample(service, "streamdedup_index_storage_failing") == 1)


async def test_a_full_index_map_pauses_consumption_with_backoff_and_a_larger_map_goes_on_from_there(
    kafka_bootstrap: str,
    topics: Topics,
    kafka_produce: Any,
    kafka_consume: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The map cannot grow past index.max_map_size_bytes, and a setting changes only with a restart: the pause,
    # the readiness, the metrics and the backoff are watched in the running service, the space returns with a
    # restart under a larger limit.
    caplog.set_level(logging.INFO, logger=service_module.__name__)
    limit = 2 << 20
    stream = synthetic_stream(6000, seed=43)
    config = quick_retries(kafka_bootstrap, topics, tmp_path / "index", batch_max_records=100)
    config["index"].update(map_size_bytes=limit, max_map_size_bytes=limit)
    config["metrics"] = {"enabled": True, "host": "127.0.0.1", "port": 0}
    settings = load_settings(None, **config)
    await kafka_produce(topics.input, stream)

    def last_pauses() -> list[float]:
        """The pauses since the index last stored a batch (a batch decided with those queued behind it may not
        fit where it fits alone)."""
        pauses: list[float] = []
        for record in caplog.records:
            if "stores batches again" in record.getMessage():
                pauses = []
            elif m := re.search(r"THE INDEX CANNOT STORE THE BATCH .* trying again in ([\d.]+) s", record.getMessage()):
                pauses.append(float(m.group(1)))
        return pauses

    async with DedupService(settings) as service, aiohttp.ClientSession() as session:
        await wait_for(_storage_failing(service), 120, "the index map to fill")
        await wait_for(lambda: _async_true(len(last_pauses()) >= 4), 60, "four attempts at the same batch")
        stuck = service.stats.consumed
        status, body = await _readyz(session, service)
        await asyncio.sleep(2)  # paused: nothing more is consumed, nothing is lost
        assert service.running and service.stats.consumed == stuck < len(stream)
        assert _sample(service, "streamdedup_index_capacity_bytes") == limit
        # The group kept this member: one assignment, no rebalance since.
        assert _sample(service, "streamdedup_rebalances_total") == 1
    assert status == 503 and body["checks"]["index_storing"] is False
    assert f"max_map_size={limit}" in body["reasons"]["index_storing"]
    assert last_pauses()[:5] == pytest.approx([0.2, 0.4, 0.8, 0.8, 0.8])
    assert await committed_offset(kafka_bootstrap, config["kafka"]["group_id"], topics.input) == stuck

    config["index"]["max_map_size_bytes"] = 4 * limit
    larger = load_settings(None, **config)
    async with DedupService(larger) as service:
        await wait_for(lambda: _consumed(service, len(stream) - stuck), 120, "the rest of the stream")
        assert _sample(service, "streamdedup_index_storage_failing") == 0
    expected = offline_novel(larger, tmp_path / "offline", stream, topics.input, batch=100)
    assert_same_output(await kafka_consume(topics.output, timeout=60), expected)


async def test_a_full_disk_pauses_consumption_and_consuming_resumes_by_itself_once_there_is_room(
    kafka_bootstrap: str,
    topics: Topics,
    kafka_produce: Any,
    kafka_consume: Any,
    tmp_path: Path,
) -> None:
    stream = synthetic_stream(3000, seed=47)
    config = quick_retries(kafka_bootstrap, topics, tmp_path / "index", batch_max_records=100)
    config["metrics"] = {"enabled": True, "host": "127.0.0.1", "port": 0}
    settings = load_settings(None, **config, dedup={"workers": 1})
    await kafka_produce(topics.input, stream[:500])
    async with DedupService(settings) as service, aiohttp.ClientSession() as session:
        await wait_for(lambda: _consumed(service, 500), 60, "the first five hundred")
        pid = service._decisions.pid
        assert pid is not None
        # The kernel refuses to grow the index's file past its size: the decision process's file size limit
        # (RLIMIT_FSIZE) fails LMDB's writes with EFBIG where a full disk fails them with ENOSPC.
        room = (tmp_path / "index" / "data.mdb").stat().st_size
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (room, resource.RLIM_INFINITY))
        await kafka_produce(topics.input, stream[500:])
        await wait_for(_storage_failing(service), 60, "the disk to be full")
        await wait_for(
            lambda: _async_true(_sample(service, "streamdedup_index_storage_errors_total") >= 3), 60, "three attempts"
        )
        full_status, full_body = await _readyz(session, service)
        stuck = service.stats.consumed
        assert service.running and stuck < len(stream)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        await wait_for(lambda: _consumed(service, len(stream)), 120, "the rest of the stream")
        status, body = await _readyz(session, service)
        assert _sample(service, "streamdedup_index_storage_failing") == 0
        assert _sample(service, "streamdedup_rebalances_total") == 1
        deaths = _worker_deaths(service)
    # EFBIG, or EIO where a write got part of its pages out: either way the commit failed and nothing is lost.
    assert full_status == 503 and full_body["reasons"]["index_storing"].startswith(
        "IndexStorageError: batch not stored"
    )
    assert (status, body["checks"]["index_storing"], "reasons" in body) == (200, True, False)
    assert deaths == {"signer": 0.0, "decision": 0.0}
    expected = offline_novel(settings, tmp_path / "offline", stream, topics.input, batch=100)
    assert_same_output(await kafka_consume(topics.output, timeout=60), expected)


async def test_a_document_that_kills_the_decision_process_is_found_by_halving_and_dead_lettered(
    kafka_bootstrap: str,
    topics: Topics,
    kafka_produce: Any,
    kafka_consume: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=service_module.__name__)
    stream = synthetic_stream(400, seed=41)
    poison_at = 200
    plant_decision_crash(monkeypatch, f"{topics.input}-0-{poison_at}")
    config = quick_retries(kafka_bootstrap, topics, tmp_path / "index", batch_max_records=32)
    settings = load_settings(None, **config, dedup={"workers": 1})
    await kafka_produce(topics.input, stream[:poison_at])
    async with DedupService(settings) as service:
        await wait_for(lambda: _consumed(service, poison_at), 60, "the records before the poison")
        # Produced while the service waits for input, the poison opens the next batch: every part that kills
        # the process starts with it, so no part is decided between two deaths (which would reset the pause).
        await kafka_produce(topics.input, stream[poison_at:])
        await wait_for(lambda: _consumed(service, len(stream)), 180, "the rest of the stream")
        assert service.running
        deaths = _worker_deaths(service)
        rebalances = _sample(service, "streamdedup_rebalances_total")
        crashes = _sample(service, "streamdedup_messages_dead_lettered_total", reason="decide_crash")
    pauses = _logged_pauses(caplog, r"died.*; starting a new one in ([\d.]+) s")
    # Two deaths on the whole batch, then one for each halving down to the poison.
    assert len(pauses) >= 4
    assert pauses == pytest.approx([0.0] + [min(0.2 * 2**k, 0.8) for k in range(len(pauses) - 1)])
    assert deaths == {"signer": 0.0, "decision": float(len(pauses))}
    assert (rebalances, crashes, dict(service.stats.dead_lettered)) == (1, 1, {"decide_crash": 1})
    (dead,) = await kafka_consume(topics.dead_letters, count=1)
    assert (dead.value, header(dead, HEADER_DEAD_LETTER_REASON), header(dead, HEADER_DEAD_LETTER_ERROR)) == (
        stream[poison_at].value,
        b"decide_crash",
        b"DecisionProcessDied",
    )
    # Every other record once, with the verdicts of a stream without the poison.
    without = stream[:poison_at] + stream[poison_at + 1 :]
    expected = offline_novel(settings, tmp_path / "offline", without, topics.input, batch=32)
    assert_same_output(await kafka_consume(topics.output, timeout=60), expected)
    duplicates = await kafka_consume(topics.duplicates, timeout=60)
    assert len(duplicates) == len(without) - len(expected)


def _worker_deaths(service: DedupService) -> dict[str, float | None]:
    return {
        kind: service.metrics.registry.get_sample_value("streamdedup_worker_deaths_total", {"worker": kind})
        for kind in WORKER_KINDS
    }


async def test_workers_die_with_a_killed_service(kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", overrides(kafka_bootstrap, topics, tmp_path / "index"))
    expected = load_settings(config).dedup.workers + 1  # the signing workers and the decision process
    process = start_service(config, tmp_path / "service.log")
    try:
        # Killed once serving: a worker still importing when its parent dies exits only after its imports
        # (it checks its parent before serving), which on a loaded host can take longer than the wait below.
        await wait_for(lambda: _logged(tmp_path / "service.log", "owning all"), 120, "the service to serve")
        children = worker_children(process.pid)
        assert len(children) == expected, children
    finally:
        process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(process.wait, 30)
    try:
        await wait_for(lambda: _async_true(not any(map(process_running, children))), 10, "orphans to exit")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {_states(children)}") from None


def _states(pids: list[int]) -> dict[int, str]:
    """What each process is doing (its /proc state and wait channel), for a failure message."""
    states = {}
    for pid in pids:
        try:
            state = process_state(pid)
            states[pid] = "gone" if state is None else f"{state} in {Path(f'/proc/{pid}/wchan').read_text() or '-'}"
        except FileNotFoundError:
            states[pid] = "gone"
    return states


async def _async_true(value: bool) -> bool:
    return value
