"""aiokafka keyword arguments from KafkaSettings: addresses, timeouts and security (SASL PLAIN/SCRAM, TLS)."""

from __future__ import annotations

from typing import Any

from aiokafka.helpers import create_ssl_context

from ..settings import KafkaSecuritySettings, KafkaSettings

__all__ = ["common_options", "security_options"]


def common_options(settings: KafkaSettings) -> dict[str, Any]:
    """Options every client (consumer, producer, admin) takes."""
    return {
        "bootstrap_servers": settings.bootstrap_servers,
        "client_id": settings.client_id,
        "request_timeout_ms": settings.request_timeout_ms,
        "retry_backoff_ms": int(settings.retry_backoff_seconds * 1000),
        **security_options(settings.security),
    }


def security_options(security: KafkaSecuritySettings) -> dict[str, Any]:
    """Security options for aiokafka; passwords are unwrapped here only, at the last moment."""
    options: dict[str, Any] = {"security_protocol": security.protocol}
    if security.protocol in ("SSL", "SASL_SSL"):
        context = create_ssl_context(
            cafile=security.ssl_cafile,
            certfile=security.ssl_certfile,
            keyfile=security.ssl_keyfile,
            password=security.ssl_key_password.get_secret_value() if security.ssl_key_password else None,
        )
        context.check_hostname = security.ssl_check_hostname
        options["ssl_context"] = context
    if security.protocol.startswith("SASL"):
        options["sasl_mechanism"] = security.sasl_mechanism
        options["sasl_plain_username"] = security.sasl_username
        options["sasl_plain_password"] = security.sasl_password.get_secret_value() if security.sasl_password else None
    return options
