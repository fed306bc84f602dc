from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

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
