from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import InvalidReplicationFactorError

from streamdedup.kafka.admin import admin_client, ensure_topics, partition_counts, wait_for_group_coordinator
from streamdedup.kafka.broker import LocalBroker

pytestmark = pytest.mark.integration


async def test_ensure_topics_creates_only_what_is_missing_and_waits_for_leaders(kafka_bootstrap: str) -> None:
    async with admin_client(bootstrap_servers=kafka_bootstrap) as admin:
        await ensure_topics(admin, {"admin-test-a": 2})
        await ensure_topics(admin, {"admin-test-a": 5, "admin-test-b": 3})
        counts = await partition_counts(admin, ["admin-test-a", "admin-test-b", "admin-test-missing"])
        await admin.delete_topics(["admin-test-a", "admin-test-b"])
    # An existing topic keeps its partitions; one that does not exist is left out.
    assert counts == {"admin-test-a": 2, "admin-test-b": 3}


@pytest.mark.slow
def test_a_fresh_cluster_coordinates_the_group_before_its_consumer_asks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a new broker the offsets topic does not exist yet: the first group coordinator lookup creates it and
    is answered "not available" until it is served, which a consumer logs as an ERROR. Waiting first avoids it."""
    caplog.set_level(logging.INFO)
    broker = LocalBroker(tmp_path / "kafka")
    bootstrap = broker.start()

    async def scenario() -> tuple[int, int]:
        async with admin_client(bootstrap_servers=bootstrap) as admin:
            await ensure_topics(admin, {"fresh-input": 1})
            coordinator = await wait_for_group_coordinator(admin, "fresh-group", timeout=60)
        consumer = AIOKafkaConsumer("fresh-input", bootstrap_servers=bootstrap, group_id="fresh-group")
        await consumer.start()
        try:
            async with asyncio.timeout(60):
                while not consumer.assignment():
                    await consumer.getmany(timeout_ms=100)
            return coordinator, len(consumer.assignment())
        finally:
            await consumer.stop()

    try:
        coordinator, assigned = asyncio.run(scenario())
    finally:
        broker.stop()
    assert (coordinator, assigned) == (1, 1)  # node.id of the local broker; the one partition
    assert any("Joined group 'fresh-group'" in record.getMessage() for record in caplog.records)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


async def broker_default_replication(admin, topic: str) -> int:
    """``default.replication.factor`` as the broker leading the topic's first partition reports it."""
    (description,) = await admin.describe_topics([topic])
    leader = str(description["partitions"][0]["leader"])
    (response,) = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.BROKER, leader, {"default.replication.factor": None})]
    )
    ((*_, entries),) = response.resources
    ((name, value, *_),) = entries
    assert name == "default.replication.factor"
    return int(value)


async def replica_counts(admin, topic: str) -> set[int]:
    (description,) = await admin.describe_topics([topic])
    return {len(partition["replicas"]) for partition in description["partitions"]}


async def test_topics_left_to_the_default_get_the_clusters_replication(kafka_bootstrap: str) -> None:
    async with admin_client(bootstrap_servers=kafka_bootstrap) as admin:
        await ensure_topics(admin, {"admin-test-default-rf": 3})
        default = await broker_default_replication(admin, "admin-test-default-rf")
        replicas = await replica_counts(admin, "admin-test-default-rf")
        await admin.delete_topics(["admin-test-default-rf"])
    assert replicas == {default}


@pytest.mark.slow
def test_the_replication_factor_left_unset_is_the_brokers_not_ours(tmp_path: Path) -> None:
    """A broker whose default is 2 replicas, alone in its cluster: a topic left to the default cannot be
    created (the broker applied its 2, not a hard-coded 1), and the error says so at once instead of a wait for
    leaders that never come. One given explicitly is created."""
    extra = tmp_path / "extra.properties"
    extra.write_text("default.replication.factor=2\n")
    broker = LocalBroker(tmp_path / "kafka", extra_config=extra)
    bootstrap = broker.start()

    async def scenario() -> tuple[int, str, set[int]]:
        async with admin_client(bootstrap_servers=bootstrap) as admin:
            started = time.monotonic()
            with pytest.raises(InvalidReplicationFactorError) as refused:
                await ensure_topics(admin, {"rf-default": 1}, timeout=60)
            assert time.monotonic() - started < 10
            await ensure_topics(admin, {"rf-explicit": 1}, replication_factor=1)
            return (
                await broker_default_replication(admin, "rf-explicit"),
                str(refused.value),
                await replica_counts(admin, "rf-explicit"),
            )

    try:
        default, refusal, explicit = asyncio.run(scenario())
    finally:
        broker.stop()
    assert default == 2
    assert "rf-default" in refusal and "replication factor of 2" in refusal
    assert explicit == {1}
