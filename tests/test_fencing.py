"""Transactional ids on a shared cluster: deployments never fence each other, and an instance frozen past its
timeouts is fenced by the one that replaced it and publishes nothing when it wakes (real broker, real
``streamdedup run`` processes for the freeze)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from streamdedup.service import DedupService
from streamdedup.settings import load_settings
from tests.conftest import OutRecord, consume_records, produce_records
from tests.test_service import Topics, overrides, wait_for

pytestmark = pytest.mark.integration


def stories(first: int, count: int) -> list[OutRecord]:
    """Distinct documents, none a near-copy of another."""
    return [
        OutRecord(json.dumps({"text": f"story {i} " + " ".join(f"s{i}w{j}" for j in range(12))}).encode())
        for i in range(first, first + count)
    ]


def derived(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the transactional id left to its default (derived from the group)."""
    del config["kafka"]["transactional_id"]
    return config


async def test_two_deployments_with_their_own_groups_never_fence_each_other(
    kafka_bootstrap: str, topic_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    source = await topic_factory(1, prefix="in")
    deployments = []
    for name in ("east", "west"):
        topics = Topics(
            input=source,
            output=await topic_factory(1, prefix=f"out-{name}"),
            duplicates=await topic_factory(1, prefix=f"dup-{name}"),
            dead_letters=await topic_factory(1, prefix=f"dlq-{name}"),
        )
        deployments.append((topics, load_settings(None, **derived(overrides(kafka_bootstrap, topics, tmp_path / name)))))
    (east_topics, east), (west_topics, west) = deployments
    assert east.kafka.transactional_id is None and west.kafka.transactional_id is None
    assert east.kafka.producer_transactional_id == east.kafka.group_id
    assert west.kafka.producer_transactional_id == west.kafka.group_id != east.kafka.group_id

    async with DedupService(east) as first:
        await produce_records(kafka_bootstrap, source, stories(0, 20))
        await wait_for(lambda: _published(first, 20), 60, "the first deployment to publish")
        # The second starts while the first runs: its producer must not fence the first one's.
        async with DedupService(west) as second:
            await wait_for(lambda: _published(second, 20), 60, "the second deployment to catch up")
            await produce_records(kafka_bootstrap, source, stories(20, 20))
            await wait_for(lambda: _published(first, 40), 60, "the first deployment to publish again")
            await wait_for(lambda: _published(second, 40), 60, "the second deployment to publish again")
    for topics in (east_topics, west_topics):
        output = await consume_records(kafka_bootstrap, topics.output)
        assert sorted(record.value for record in output) == sorted(record.value for record in stories(0, 40))
    # Neither session was ever broken (a fenced producer ends its session with a Kafka error).
    assert not [record.getMessage() for record in caplog.records if "Kafka error" in record.getMessage()]


async def _published(service: DedupService, n: int) -> bool:
    return service.stats.published >= n
