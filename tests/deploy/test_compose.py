"""deploy/docker-compose.yml: one command brings up Kafka (KRaft), streamdedup, Prometheus and Grafana."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.support import DEPLOY, REPO, dockerfile_env, dockerfile_instructions, effective_settings, load_yaml

COMPOSE = load_yaml(DEPLOY / "docker-compose.yml")
SERVICES: dict[str, Any] = COMPOSE["services"]
LOOPBACK = "127.0.0.1"


def volume_mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> source (named volume or path relative to deploy/)."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        mounts[target] = source
    return mounts


def service_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    env = {**dockerfile_env(dockerfile_instructions()), **SERVICES["streamdedup"]["environment"]}
    return effective_settings(monkeypatch, tmp_path, env, (REPO / "config.yaml").read_text())


def test_the_four_services_and_their_volumes_are_declared() -> None:
    assert set(SERVICES) == {"kafka", "topics", "streamdedup", "prometheus", "grafana"}
    named = {
        source
        for service in SERVICES.values()
        for source in volume_mounts(service).values()
        if not source.startswith(".")
    }
    assert named == set(COMPOSE["volumes"])
    for service in SERVICES.values():
        for source in volume_mounts(service).values():
            if source.startswith("."):
                assert (DEPLOY / source).exists(), source
        for dependency in service.get("depends_on", []):
            assert dependency in SERVICES


def test_kafka_is_the_official_image_in_kraft_mode_at_the_tested_version() -> None:
    kafka = SERVICES["kafka"]
    image, tag = kafka["image"].split(":")
    assert image == "apache/kafka"
    pom = (DEPLOY / "kafka" / "pom.xml").read_text()
    assert tag == re.search(r"<kafka.version>(.+)</kafka.version>", pom).group(1)
    env = kafka["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    listeners = dict(
        re.fullmatch(r"(\w+)://[\w.-]*:(\d+)", item).groups() for item in env["KAFKA_LISTENERS"].split(",")
    )
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) == set(protocols)
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    node, voter = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split("@")
    assert int(node) == env["KAFKA_NODE_ID"]
    assert voter == f"{kafka['hostname']}:{listeners[controller]}"
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in listeners
    # A single broker: the transaction state log (exactly-once) must accept one replica.
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == 1
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 1
    assert env["KAFKA_LOG_DIRS"] in volume_mounts(kafka)
    advertised = {
        name: (host, port)
        for name, host, port in (
            re.fullmatch(r"(\w+)://([\w.-]+):(\d+)", item).groups()
            for item in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
        )
    }
    published = {tuple(port.split(":")[:2]) for port in kafka["ports"]}
    external = {address for name, address in advertised.items() if name != env["KAFKA_INTER_BROKER_LISTENER_NAME"]}
    assert external <= published


def test_streamdedup_reaches_kafka_on_its_internal_listener(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = service_settings(monkeypatch, tmp_path)
    env = SERVICES["kafka"]["environment"]
    internal = env["KAFKA_INTER_BROKER_LISTENER_NAME"]
    advertised = re.search(rf"{internal}://([\w.-]+:\d+)", env["KAFKA_ADVERTISED_LISTENERS"]).group(1)
    assert settings.kafka.bootstrap_servers in (advertised, [advertised])
    assert SERVICES["streamdedup"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert SERVICES["streamdedup"]["depends_on"]["topics"]["condition"] == "service_completed_successfully"


def test_the_input_topic_is_created_before_the_service_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = service_settings(monkeypatch, tmp_path)
    topics = SERVICES["topics"]
    assert topics["image"] == SERVICES["kafka"]["image"]
    flags = dict(flag.removeprefix("--").partition("=")[0::2] for flag in topics["command"][1:])
    assert topics["command"][0] == "/opt/kafka/bin/kafka-topics.sh" and "create" in flags and "if-not-exists" in flags
    assert flags["topic"] in settings.kafka.input_topics
    assert flags["bootstrap-server"] == settings.kafka.bootstrap_servers
    assert int(flags["replication-factor"]) == 1


def test_streamdedup_image_index_and_port(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    service = SERVICES["streamdedup"]
    assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    settings = service_settings(monkeypatch, tmp_path)
    mounts = volume_mounts(service)
    assert any(settings.index.path.is_relative_to(target) for target in mounts), "the index is not on a volume"
    assert f"{LOOPBACK}:{settings.metrics.port}:{settings.metrics.port}" in service["ports"]
    target = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")["scrape_configs"][0]["static_configs"][0]["targets"][0]
    assert target == f"streamdedup:{settings.metrics.port}"
    # Long enough to finish and commit the batch in flight after SIGTERM.
    assert int(service["stop_grace_period"].removesuffix("s")) >= 30


def test_prometheus_loads_the_mounted_config() -> None:
    prometheus = SERVICES["prometheus"]
    config_flag = next(flag for flag in prometheus["command"] if flag.startswith("--config.file="))
    config_path = Path(config_flag.split("=", 1)[1])
    mounts = volume_mounts(prometheus)
    source = mounts[str(config_path.parent)]
    assert (DEPLOY / source / config_path.name).is_file()
    storage = next(flag for flag in prometheus["command"] if flag.startswith("--storage.tsdb.path="))
    assert storage.split("=", 1)[1] in mounts


def test_every_port_is_published_on_the_loopback_only() -> None:
    published = {name: service["ports"] for name, service in SERVICES.items() if "ports" in service}
    assert set(published) == {"kafka", "streamdedup", "prometheus", "grafana"}
    for name, ports in published.items():
        for port in ports:
            # host address:host port:container port; two parts would bind every interface of the host.
            address, host_port, container_port = port.split(":")
            assert address == LOOPBACK, (name, port)
            assert host_port.isdigit() and container_port.isdigit(), (name, port)


def test_grafanas_admin_password_comes_from_the_environment_and_is_required() -> None:
    environment = SERVICES["grafana"]["environment"]
    # ${VAR:?message}: compose stops with the message when the variable is unset or empty.
    reference = re.fullmatch(r"\$\{(\w+):\?(.+)\}", environment["GF_SECURITY_ADMIN_PASSWORD"])
    assert reference is not None, environment["GF_SECURITY_ADMIN_PASSWORD"]
    variable = reference.group(1)
    assert variable in reference.group(2)
    # The file says how to set it.
    comments = [line for line in (DEPLOY / "docker-compose.yml").read_text().splitlines() if line.startswith("#")]
    assert any(f"{variable}=" in line for line in comments)
    assert not any("admin/admin" in line for line in comments)


def test_prometheus_lifecycle_and_admin_apis_are_off() -> None:
    flags = [flag.partition("=")[0] for flag in SERVICES["prometheus"]["command"]]
    assert "--web.enable-lifecycle" not in flags
    assert "--web.enable-admin-api" not in flags
