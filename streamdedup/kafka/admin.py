"""Cluster administration the service, the demo and the benches need: partition counts, create-if-missing,
and waiting until the cluster can coordinate a consumer group."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, NoError, TopicAlreadyExistsError, for_code

__all__ = ["admin_client", "ensure_topics", "partition_counts", "wait_for_group_coordinator"]


@asynccontextmanager
async def admin_client(**options: Any) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started ``AIOKafkaAdminClient(**options)``, closed on leaving."""
    admin = AIOKafkaAdminClient(**options)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def partition_counts(admin: AIOKafkaAdminClient, topics: Iterable[str]) -> dict[str, int]:
    """Partitions of each topic that exists and has a leader for every partition (others are left out)."""
    counts: dict[str, int] = {}
    for description in await admin.describe_topics(list(topics)):
        partitions = description["partitions"]
        if description["error_code"] == 0 and partitions and all(p["leader"] >= 0 for p in partitions):
            counts[description["topic"]] = len(partitions)
    return counts


async def ensure_topics(
    admin: AIOKafkaAdminClient,
    topics: Mapping[str, int],
    *,
    replication_factor: int | None = None,
    configs: Mapping[str, Mapping[str, str]] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create the topics (name -> partitions) that do not exist yet, each with its ``configs`` (topic
    configuration, e.g. ``retention.ms``), and wait until each has its leaders.

    ``replication_factor`` None leaves it to the cluster (its ``default.replication.factor``), so a topic
    gets as many replicas as the operators chose for the cluster. A topic the cluster refuses to create
    raises the cluster's error (``InvalidReplicationFactorError`` when it has fewer brokers than replicas).
    """
    existing = await partition_counts(admin, topics)
    configs = configs or {}
    missing = [
        _new_topic(name, partitions, replication_factor, configs.get(name, {}))
        for name, partitions in topics.items()
        if name not in existing
    ]
    if missing:
        response = await admin.create_topics(missing)
        for topic, code, *message in response.topic_errors:
            error = for_code(code)
            # Already existing: another process created it between our look and our create.
            if error is not NoError and error is not TopicAlreadyExistsError:
                raise error(f"cannot create topic {topic}: {message[0] if message else error.message}")
    async with asyncio.timeout(timeout):
        while len(await partition_counts(admin, topics)) < len(topics):
            await asyncio.sleep(0.1)


def _new_topic(name: str, partitions: int, replication_factor: int | None, config: Mapping[str, str]) -> NewTopic:
    if replication_factor is not None:
        return NewTopic(
            name, num_partitions=partitions, replication_factor=replication_factor, topic_configs=dict(config)
        )
    # -1 asks the broker for its default (KIP-464: Kafka 2.4+ brokers, whatever CreateTopics version aiokafka
    # sends). aiokafka's NewTopic takes -1 only alongside replica assignments: an empty mapping passes its
    # check and assigns nothing.
    return NewTopic(
        name, num_partitions=partitions, replication_factor=-1, replica_assignments={}, topic_configs=dict(config)
    )


async def wait_for_group_coordinator(admin: AIOKafkaAdminClient, group_id: str, *, timeout: float = 30.0) -> int:
    """The id of the broker coordinating ``group_id``, once the cluster can name one.

    A fresh cluster creates its offsets topic on the first such request and answers "not available" until that
    topic is served. A consumer meeting this retries, but aiokafka logs each attempt as an ERROR; asking first
    keeps a healthy start free of them. Raises ``TimeoutError`` after ``timeout`` seconds.
    """
    async with asyncio.timeout(timeout):
        while True:
            try:
                return await admin.find_coordinator(group_id)
            except KafkaError as exc:
                if not exc.retriable:
                    raise
            await asyncio.sleep(0.1)
