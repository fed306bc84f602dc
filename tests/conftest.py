"""Shared pytest fixtures: logging, the real Kafka brokers, process state, and planted bugs."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import signal
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from streamdedup import decision_process as decision_process_module
from streamdedup.decide import Deduplicator
from streamdedup.fingerprint import Fingerprinter
from streamdedup.kafka.admin import admin_client, ensure_topics, partition_counts
from streamdedup.kafka.broker import LocalBroker

# --- Logging: every test leaves the root logger as it found it -------------------------------------------


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    """The CLI's ``configure_logging`` replaces the root handlers with one on the standard error of the moment,
    which is pytest's capture of that test; a later test logging through it would write to a closed file. It
    also sets the Kafka client's loggers' levels, which a later test would inherit."""
    from streamdedup.logs import LIBRARY_LOGGERS

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    libraries = {name: logging.getLogger(name).level for name in LIBRARY_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, library_level in libraries.items():
        logging.getLogger(name).setLevel(library_level)


# --- Kafka: one real broker per session, topic, produce and consume factories -------------------------


@dataclass(frozen=True, slots=True)
class OutRecord:
    """A record to produce in a test; ``partition`` None lets the key decide."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None
    timestamp_ms: int | None = None


Produce = Callable[..., Awaitable[None]]
Consume = Callable[..., Awaitable[list[ConsumerRecord]]]


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a real Kafka broker: $KAFKA_BOOTSTRAP_SERVERS, else a local one for the session."""
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    broker = LocalBroker(tmp_path_factory.mktemp("kafka"))
    bootstrap = broker.start()
    try:
        yield bootstrap
    finally:
        broker.stop()


@pytest.fixture
async def topic_factory(kafka_bootstrap: str) -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """``await topic_factory(partitions=1, prefix="t")`` creates a topic with a unique name and returns it."""
    created: list[str] = []
    async with admin_client(bootstrap_servers=kafka_bootstrap) as admin:

        async def create(partitions: int = 1, *, prefix: str = "t") -> str:
            name = f"{prefix}-{uuid.uuid4().hex[:12]}"
            await ensure_topics(admin, {name: partitions})
            created.append(name)
            return name

        try:
            yield create
        finally:
            if created:
                await admin.delete_topics(created)


async def produce_records(
    bootstrap: str, topic: str, records: Sequence[OutRecord | bytes | None], **producer_options: object
) -> None:
    """Send OutRecords (or bare values) to ``topic`` and wait for every acknowledgement."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, **producer_options)
    await producer.start()
    try:
        sent = []
        for record in records:
            if not isinstance(record, OutRecord):
                record = OutRecord(record)
            sent.append(
                await producer.send(
                    topic,
                    record.value,
                    key=record.key,
                    partition=record.partition,
                    headers=list(record.headers),
                    timestamp_ms=record.timestamp_ms,
                )
            )
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def consume_records(
    bootstrap: str,
    topic: str,
    *,
    count: int | None = None,
    isolation_level: str = "read_committed",
    timeout: float = 30.0,
) -> list[ConsumerRecord]:
    """Every partition of ``topic`` from the beginning, without a group, ordered by (partition, offset).

    With ``count`` it waits until that many records arrived (TimeoutError otherwise); without, it reads up to
    the end offsets seen at the start.
    """
    async with admin_client(bootstrap_servers=bootstrap) as admin:
        partition_count = (await partition_counts(admin, [topic]))[topic]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(partition_count)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        end = await consumer.end_offsets(partitions)
        records: list[ConsumerRecord] = []
        async with asyncio.timeout(timeout):
            while True:
                if count is not None and len(records) >= count:
                    break
                if count is None and all([await consumer.position(tp) >= end[tp] for tp in partitions]):
                    break
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    records.extend(batch)
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        await consumer.stop()


@pytest.fixture
def kafka_produce(kafka_bootstrap: str) -> Produce:
    """``await kafka_produce(topic, records)``: :func:`produce_records` on the session broker."""
    return functools.partial(produce_records, kafka_bootstrap)


@pytest.fixture
def kafka_consume(kafka_bootstrap: str) -> Consume:
    """``await kafka_consume(topic, count=None, isolation_level="read_committed", timeout=30)``:
    :func:`consume_records` on the session broker."""
    return functools.partial(consume_records, kafka_bootstrap)


# --- end of the Kafka section -----------------------------------------------------------------------------


# --- Kafka behind TLS and SASL: a second local broker whose client listeners want credentials ---------------
SECURED_USER = "svc"
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class SecuredKafka:
    """Addresses and credentials of the secured broker. ``plaintext`` is its open listener, for set-up and for
    reading results back; ``sasl_ssl`` takes every SASL mechanism over TLS, ``ssl`` wants a client certificate.
    ``passwords`` holds the password of ``SECURED_USER`` for each mechanism; ``other_ca`` signed nothing the
    broker holds."""

    plaintext: str
    sasl_ssl: str
    ssl: str
    ca: Path
    other_ca: Path
    client_cert: Path
    client_key: Path
    passwords: dict[str, str]


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def certificate_authority(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-keyout",
        key,
        "-out",
        cert,
    )
    return cert, key


def _signed(
    directory: Path, name: str, authority: tuple[Path, Path], extensions: str | None = None
) -> tuple[Path, Path]:
    cert, key, request = directory / f"{name}.pem", directory / f"{name}-key.pem", directory / f"{name}.csr"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", key, "-out", request)
    signing = [
        "x509",
        "-req",
        "-in",
        request,
        "-CA",
        authority[0],
        "-CAkey",
        authority[1],
        "-CAcreateserial",
        "-days",
        "2",
    ]
    if extensions is not None:
        (directory / f"{name}.ext").write_text(extensions + "\n")
        signing += ["-extfile", directory / f"{name}.ext"]
    _openssl(*signing, "-out", cert)
    return cert, key


def _properties_text(text: str) -> str:
    """Java reads a properties file as ISO-8859-1: every other character goes in as UTF-16 ``\\u`` escapes."""
    escaped = []
    for char in text:
        if char.isascii():
            escaped.append(char)
            continue
        units = char.encode("utf-16-be")
        escaped += [f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2)]
    return "".join(escaped)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    """A local broker with SASL_SSL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) and mutual-TLS listeners, always
    local: it needs listeners of its own. Certificates come from openssl, the SCRAM users from the storage
    format, the PLAIN user from the listener's JAAS line."""
    work = tmp_path_factory.mktemp("secured-kafka")
    tls = work / "tls"
    tls.mkdir()
    authority = certificate_authority(tls, "streamdedup-test-ca")
    other_ca, _ = certificate_authority(tls, "some-other-ca")
    server_cert, server_key = _signed(tls, "localhost", authority, "subjectAltName=IP:127.0.0.1,DNS:localhost")
    client_cert, client_key = _signed(tls, "streamdedup-client", authority)
    keystore = tls / "server-keystore.pem"
    keystore.write_text(server_key.read_text() + server_cert.read_text())
    passwords = {mechanism: secrets.token_urlsafe(16) for mechanism in SASL_MECHANISMS}
    # Non-ASCII: aiokafka logs a PLAIN request's bytes at DEBUG, where such a password shows escaped.
    passwords["PLAIN"] += "-grüße"
    sasl_port, ssl_port = free_port(), free_port()
    listeners = (
        "PLAINTEXT://127.0.0.1:@BROKER_PORT@,CONTROLLER://127.0.0.1:@CONTROLLER_PORT@,"
        f"SASL_SSL://127.0.0.1:{sasl_port},SSL://127.0.0.1:{ssl_port}"
    )
    jaas = {
        "plain": (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'user_{SECURED_USER}="{passwords["PLAIN"]}";'
        ),
        "scram-sha-256": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "scram-sha-512": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
    }
    config = work / "secured.properties"
    lines = [
        f"listeners={listeners}",
        f"advertised.listeners={listeners}",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL",
        f"sasl.enabled.mechanisms={','.join(SASL_MECHANISMS)}",
        *(f"listener.name.sasl_ssl.{mechanism}.sasl.jaas.config={line}" for mechanism, line in jaas.items()),
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={keystore}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={authority[0]}",
        "listener.name.ssl.ssl.client.auth=required",
    ]
    config.write_text(_properties_text("\n".join(lines)) + "\n")
    scram = [
        argument
        for mechanism in SASL_MECHANISMS[1:]
        for argument in ("--add-scram", f"{mechanism}=[name={SECURED_USER},password={passwords[mechanism]}]")
    ]
    broker = LocalBroker(work / "state", extra_config=config, format_args=scram)
    plaintext = broker.start()
    try:
        yield SecuredKafka(
            plaintext=plaintext,
            sasl_ssl=f"127.0.0.1:{sasl_port}",
            ssl=f"127.0.0.1:{ssl_port}",
            ca=authority[0],
            other_ca=other_ca,
            client_cert=client_cert,
            client_key=client_key,
            passwords=passwords,
        )
    finally:
        broker.stop()


# --- end of the secured Kafka section -----------------------------------------------------------------------


# --- Processes: what /proc says of a process (worker tests) -------------------------------------------------
def process_state(pid: int) -> str | None:
    """The process's state letter in /proc (R, S, D, Z, ...), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def process_running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped by whoever inherited it."""
    return process_state(pid) not in (None, "Z")


# --- The decision core: a bug that one document sets off --------------------------------------------------


def plant_decision_bug(monkeypatch: pytest.MonkeyPatch, poison_id: str, message: str) -> None:
    """Make the decision core's lookup raise ZeroDivisionError(``message``) for any batch holding ``poison_id``."""
    real = Deduplicator._stored_matches

    def broken(self: Deduplicator, ids: list[str], *args: object) -> object:
        if poison_id in ids:
            raise ZeroDivisionError(message)
        return real(self, ids, *args)

    monkeypatch.setattr(Deduplicator, "_stored_matches", broken)


# --- The signer: a bug that one text sets off -------------------------------------------------------------


def plant_signing_bug(monkeypatch: pytest.MonkeyPatch, poison: str, message: str) -> None:
    """Make fingerprinting a batch raise ZeroDivisionError(``message``) whenever a text of it contains ``poison``
    (in this process: signing workers started afterwards do not see it)."""
    real = Fingerprinter.fingerprint_batch

    def broken(self: Fingerprinter, texts: Sequence[str]) -> object:
        if any(poison in text for text in texts):
            raise ZeroDivisionError(message)
        return real(self, texts)

    monkeypatch.setattr(Fingerprinter, "fingerprint_batch", broken)


# --- The decision process: a document whose decision kills it ---------------------------------------------


_CRASH_ID_VARIABLE = "STREAMDEDUP_TEST_CRASH_ID"


class CrashingDecisionCore(decision_process_module._DecisionCore):
    """The decision core of a worker process that kills itself (SIGKILL) whenever it is to decide a batch holding
    the document whose id is in $STREAMDEDUP_TEST_CRASH_ID: a native crash, as no exception handler sees it."""

    def __init__(self, settings: object) -> None:
        super().__init__(settings)  # type: ignore[arg-type]
        poison = os.environ[_CRASH_ID_VARIABLE]
        decide = self.dedup.decide

        def crashing(docs: Sequence[object], **kwargs: object) -> object:
            if any(doc.id == poison for doc in docs):  # type: ignore[attr-defined]
                os.kill(os.getpid(), signal.SIGKILL)
            return decide(docs, **kwargs)  # type: ignore[arg-type]

        self.dedup.decide = crashing  # type: ignore[method-assign]


def plant_decision_crash(monkeypatch: pytest.MonkeyPatch, poison_id: str) -> None:
    """Make every decision process started afterwards kill itself when it decides a batch holding ``poison_id``
    (``dedup.workers`` >= 1: the process is spawned, imports this module and reads the id from its environment)."""
    monkeypatch.setenv(_CRASH_ID_VARIABLE, poison_id)
    monkeypatch.setattr(decision_process_module, "_DecisionCore", CrashingDecisionCore)
