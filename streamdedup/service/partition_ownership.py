"""Which input partitions this instance owns, and whether the index is reconciled with them: one state machine.

The consumer's rebalance listener, the reconciliation and the batch pipeline each move it, and each asks it
whether a decided batch may still be published.

    DISCONNECTED --connect--> UNASSIGNED
    any connected state --revoke--> UNASSIGNED, --assign--> ASSIGNED, --reconcile--> RECONCILING
    RECONCILING --own--> OWNING or --split--> SPLIT
    OWNING or PAUSED --pause--> PAUSED --resume--> OWNING
    any state --disconnect--> DISCONNECTED
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum

from aiokafka import TopicPartition

__all__ = ["IllegalTransition", "Ownership", "PartitionOwnership"]


class Ownership(Enum):
    DISCONNECTED = "disconnected"
    """No Kafka clients: before the first session, between two, after the last."""
    UNASSIGNED = "unassigned"
    """Clients up, no partitions: before the group assigns any, or after they were revoked."""
    ASSIGNED = "assigned"
    """Partitions assigned; the index is not yet reconciled with them."""
    RECONCILING = "reconciling"
    """Checking the assignment, rolling the index back to Kafka's offsets, replaying what it lacks."""
    SPLIT = "split"
    """Part of the input (another instance has the rest) or none of it: fetching paused, nothing processed."""
    OWNING = "owning"
    """Every input partition, the index reconciled with Kafka: batches flow."""
    PAUSED = "paused"
    """Owning, fetching paused while a failed batch waits to be decided again (index full, decision process
    died)."""


_CONNECTED = frozenset(Ownership) - {Ownership.DISCONNECTED}
# The states in which the index is reconciled with an assignment.
_RECONCILED = frozenset({Ownership.SPLIT, Ownership.OWNING, Ownership.PAUSED})


class IllegalTransition(RuntimeError):
    """A move the state machine does not allow: a bug in whoever asked for it."""


class PartitionOwnership:
    """The state, the partitions last assigned, and the assignment the index was reconciled with."""

    def __init__(self) -> None:
        self.state = Ownership.DISCONNECTED
        self.assigned: frozenset[TopicPartition] = frozenset()
        self.reconciled: frozenset[TopicPartition] | None = None

    def __repr__(self) -> str:
        return f"PartitionOwnership({self.state.name}, assigned={len(self.assigned)})"

    def connect(self) -> None:
        self._move({Ownership.DISCONNECTED}, Ownership.UNASSIGNED)

    def disconnect(self) -> None:
        self.state = Ownership.DISCONNECTED
        self.assigned = frozenset()
        self.reconciled = None

    def assign(self, partitions: frozenset[TopicPartition]) -> None:
        self._move(_CONNECTED, Ownership.ASSIGNED)
        self.assigned = partitions

    def revoke(self) -> None:
        self._move(_CONNECTED, Ownership.UNASSIGNED)
        self.assigned = frozenset()

    def reconcile(self) -> None:
        # The consumer's assignment can change before its listener runs: this starts from any connected state.
        self._move(_CONNECTED, Ownership.RECONCILING)
        self.reconciled = None

    def split(self, assignment: frozenset[TopicPartition]) -> None:
        self._move({Ownership.RECONCILING}, Ownership.SPLIT)
        self.reconciled = assignment

    def own(self, assignment: frozenset[TopicPartition]) -> None:
        self._move({Ownership.RECONCILING}, Ownership.OWNING)
        self.reconciled = assignment

    def pause(self) -> None:
        self._move({Ownership.OWNING, Ownership.PAUSED}, Ownership.PAUSED)

    def resume(self) -> None:
        self._move({Ownership.PAUSED}, Ownership.OWNING)

    def rebalanced(self, assignment: frozenset[TopicPartition]) -> bool:
        """Whether ``assignment`` (the consumer's, which may change before the listener runs) is not the one the
        index was last reconciled with: nothing is fetched, decided or published until it is."""
        return self.state not in _RECONCILED or assignment != self.reconciled

    @property
    def connected(self) -> bool:
        return self.state is not Ownership.DISCONNECTED

    @property
    def partitions_assigned(self) -> bool:
        """Assigned some partitions, and not known to share the input with another instance (readiness)."""
        return bool(self.assigned) and self.state is not Ownership.SPLIT

    def _move(self, sources: Collection[Ownership], target: Ownership) -> None:
        if self.state not in sources:
            raise IllegalTransition(f"{self.state.name} -> {target.name}")
        self.state = target
