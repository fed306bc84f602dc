"""Kafka wrappers: consumer, transactional producer, outgoing records (dead letters), topics, the local broker.

No hashing and no index here: the service composes these with the decision core.
"""

from __future__ import annotations

from .admin import admin_client, ensure_topics, partition_counts, wait_for_group_coordinator
from .broker import KAFKA_SCRIPT, BrokerError, LocalBroker
from .clients import common_options, security_options
from .consumer import BatchConsumer, RebalanceHandler
from .producer import TransactionalProducer
from .records import OutgoingRecord, dead_letter, duplicate, novel

__all__ = [
    "KAFKA_SCRIPT",
    "BatchConsumer",
    "BrokerError",
    "LocalBroker",
    "OutgoingRecord",
    "RebalanceHandler",
    "TransactionalProducer",
    "admin_client",
    "common_options",
    "dead_letter",
    "duplicate",
    "ensure_topics",
    "novel",
    "partition_counts",
    "security_options",
    "wait_for_group_coordinator",
]
