from __future__ import annotations

import asyncio
import io
import ssl
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError

from streamdedup.kafka.admin import admin_client, ensure_topics
from streamdedup.kafka.clients import common_options, security_options
from streamdedup.logs import configure_logging
from streamdedup.settings import ConfigError, KafkaSecuritySettings, KafkaSettings, Settings, load_settings
from tests.conftest import SASL_MECHANISMS, SECURED_USER, SecuredKafka, certificate_authority


def test_plaintext_passes_addresses_and_timeouts() -> None:
    options = common_options(KafkaSettings(bootstrap_servers="b1:9092,b2:9092", request_timeout_ms=5000))
    assert options == {
        "bootstrap_servers": "b1:9092,b2:9092",
        "client_id": "streamdedup",
        "request_timeout_ms": 5000,
        "retry_backoff_ms": 500,
        "security_protocol": "PLAINTEXT",
    }


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_credentials_reach_aiokafka_unmasked_but_print_masked(mechanism: str) -> None:
    security = KafkaSecuritySettings(
        protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism, sasl_username="svc", sasl_password="s3cr3t-pw"
    )
    assert security_options(security) == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "svc",
        "sasl_plain_password": "s3cr3t-pw",
    }
    assert "s3cr3t-pw" not in repr(security) and "s3cr3t-pw" not in str(KafkaSettings(security=security))


def test_sasl_password_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMDEDUP_KAFKA__SECURITY__PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("STREAMDEDUP_KAFKA__SECURITY__SASL_USERNAME", "svc")
    monkeypatch.setenv("STREAMDEDUP_KAFKA__SECURITY__SASL_PASSWORD", "from-env")
    security = load_settings(None).kafka.security
    assert (security.protocol, security.sasl_password.get_secret_value()) == ("SASL_SSL", "from-env")


def test_sasl_without_credentials_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.security.*sasl_username and sasl_password"):
        load_settings(None, kafka={"security": {"protocol": "SASL_SSL"}})


def test_unknown_mechanism_names_the_allowed_values() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.security\.sasl_mechanism.*SCRAM-SHA-256"):
        load_settings(None, kafka={"security": {"sasl_mechanism": "GSSAPI"}})


def test_ssl_context_trusts_the_ca_and_loads_the_client_certificate(tmp_path: Path) -> None:
    cert, key = certificate_authority(tmp_path, "streamdedup-test")
    security = KafkaSecuritySettings(
        protocol="SSL", ssl_cafile=cert, ssl_certfile=cert, ssl_keyfile=key, ssl_check_hostname=False
    )
    context = security_options(security)["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname is False
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "streamdedup-test"),),)]


def test_client_certificate_without_key_is_rejected() -> None:
    with pytest.raises(ValueError, match="ssl_certfile and ssl_keyfile go together"):
        KafkaSecuritySettings(protocol="SSL", ssl_certfile=Path("c.pem"))


# --- Against a real broker behind TLS and SASL (the ``secured_kafka`` session broker) ----------------------


def secured_settings(bootstrap: str, **security: Any) -> Settings:
    return load_settings(None, kafka={"bootstrap_servers": bootstrap, "security": security}, logging={"level": "debug"})


def sasl_settings(secured: SecuredKafka, mechanism: str, password: str) -> Settings:
    return secured_settings(
        secured.sasl_ssl,
        protocol="SASL_SSL",
        sasl_mechanism=mechanism,
        sasl_username=SECURED_USER,
        sasl_password=password,
        ssl_cafile=str(secured.ca),
    )


@pytest.fixture
def service_log() -> Iterator[Callable[[Settings], io.StringIO]]:
    """``service_log(settings)``: the service's own logging (``configure_logging``) at the settings' level, into
    a string (conftest restores the root logger afterwards)."""

    def configure(settings: Settings) -> io.StringIO:
        stream = io.StringIO()
        configure_logging(settings, stream)
        return stream

    yield configure


async def round_trip(secured: SecuredKafka, kafka: KafkaSettings) -> list[bytes | None]:
    """Produce a record through ``kafka``'s listener and read it back through the same listener."""
    topic = f"secured-{uuid.uuid4().hex[:12]}"
    async with admin_client(bootstrap_servers=secured.plaintext) as admin:
        await ensure_topics(admin, {topic: 1})
    producer = AIOKafkaProducer(**common_options(kafka))
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"through the secured listener")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **common_options(kafka))
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), 30)
    finally:
        await consumer.stop()
    return [record.value]


def spellings(password: str) -> list[str]:
    """The password as itself and escaped in a bytes repr (how a PLAIN request's bytes are logged)."""
    return [password, repr(password.encode())[2:-1]]


@pytest.mark.integration
@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
async def test_sasl_over_tls_authenticates_with_a_real_broker_and_logs_no_password(
    secured_kafka: SecuredKafka, mechanism: str, service_log: Callable[[Settings], io.StringIO]
) -> None:
    password = secured_kafka.passwords[mechanism]
    settings = sasl_settings(secured_kafka, mechanism, password)
    log = service_log(settings)
    assert await round_trip(secured_kafka, settings.kafka) == [b"through the secured listener"]
    # The client's debug lines went through the service's log, SASL exchange included; no password is in it.
    assert f"Authenticated as {SECURED_USER} via {mechanism}" in log.getvalue()
    assert [spelling for spelling in spellings(password) if spelling in log.getvalue()] == []


@pytest.mark.integration
@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
async def test_a_wrong_password_is_refused_with_the_reason_and_not_logged(
    secured_kafka: SecuredKafka, mechanism: str, service_log: Callable[[Settings], io.StringIO]
) -> None:
    wrong = "not-" + secured_kafka.passwords[mechanism]
    settings = sasl_settings(secured_kafka, mechanism, wrong)
    log = service_log(settings)
    producer = AIOKafkaProducer(**common_options(settings.kafka))
    with pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()
    assert "SaslAuthenticationFailed" in log.getvalue()
    assert [spelling for spelling in spellings(wrong) if spelling in log.getvalue()] == []


@pytest.mark.integration
async def test_mutual_tls_with_a_client_certificate_reaches_a_real_broker(secured_kafka: SecuredKafka) -> None:
    settings = secured_settings(
        secured_kafka.ssl,
        protocol="SSL",
        ssl_cafile=str(secured_kafka.ca),
        ssl_certfile=str(secured_kafka.client_cert),
        ssl_keyfile=str(secured_kafka.client_key),
    )
    assert await round_trip(secured_kafka, settings.kafka) == [b"through the secured listener"]


@pytest.mark.integration
@pytest.mark.parametrize("missing", ["client certificate", "trust in the broker's CA"])
async def test_tls_without_a_client_certificate_or_the_right_ca_is_refused(
    secured_kafka: SecuredKafka, missing: str, service_log: Callable[[Settings], io.StringIO]
) -> None:
    certificate = {"ssl_certfile": str(secured_kafka.client_cert), "ssl_keyfile": str(secured_kafka.client_key)}
    if missing == "client certificate":
        settings = secured_settings(secured_kafka.ssl, protocol="SSL", ssl_cafile=str(secured_kafka.ca))
    else:
        settings = secured_settings(
            secured_kafka.ssl, protocol="SSL", ssl_cafile=str(secured_kafka.other_ca), **certificate
        )
    log = service_log(settings)
    producer = AIOKafkaProducer(**common_options(settings.kafka))
    with pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()
    # Without a certificate the broker just closes the connection; a client that does not trust the broker says why.
    reason = "closed" if missing == "client certificate" else "CERTIFICATE_VERIFY_FAILED"
    assert reason in log.getvalue()
