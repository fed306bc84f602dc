"""The Kafka service: the decision core between an input topic and its outputs, exactly once."""

from .dedup_service import DedupService, InstanceFenced, run_service
from .stats import ServiceStats

__all__ = ["DedupService", "InstanceFenced", "ServiceStats", "run_service"]
