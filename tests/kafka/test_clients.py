from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest

from streamdedup.kafka.clients import common_options, security_options
from streamdedup.settings import ConfigError, KafkaSecuritySettings, KafkaSettings, load_settings


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
    with pytest.raises(ConfigError, match="kafka.security.*sasl_username and sasl_password"):
        load_settings(None, kafka={"security": {"protocol": "SASL_SSL"}})


def test_unknown_mechanism_names_the_allowed_values() -> None:
    with pytest.raises(ConfigError, match="kafka.security.sasl_mechanism.*SCRAM-SHA-256"):
        load_settings(None, kafka={"security": {"sasl_mechanism": "GSSAPI"}})


def test_ssl_context_trusts_the_ca_and_loads_the_client_certificate(tmp_path: Path) -> None:
    key, cert = tmp_path / "client.key", tmp_path / "client.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=streamdedup-test",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
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
