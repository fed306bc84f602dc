"""Who decides the sequence topic: the instance that decides now, else the one whose index has followed furthest.

The decider group has one partition to give. Kafka's own assignors give it by member id, so a member that joins
with a smaller id (or an instance restarted after its session expired) takes it over with whatever index it has,
and replays up to the committed offset before it decides. Each member here tells the group, when it joins, whether
it decides and how far its index has got on the sequence topic; the leader gives the partition to the member that
decides, or else to the one furthest along (the warm standby, when there is one), the smallest id among equals.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

__all__ = ["DeciderAssignor", "DeciderClaim"]

_CLAIM = struct.Struct(">?q")


@dataclass
class DeciderClaim:
    """What this instance tells the decider group when it joins: whether it decides now, and the sequence
    offset up to which its index holds the decisions."""

    deciding: bool = False
    progress: int = 0


class DeciderAssignor:
    """An aiokafka partition assignor (an instance, with this member's claim) for the decider group."""

    name = "streamdedup-decider"
    version = 0

    def __init__(self, claim: DeciderClaim) -> None:
        self.claim = claim

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        user_data = _CLAIM.pack(self.claim.deciding, self.claim.progress)
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), user_data)

    def assign(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        claims = {member: _claim(metadata.user_data) for member, metadata in members.items()}
        # Deciding first, then furthest along, then the smallest member id.
        ranked = sorted(claims, key=lambda member: (not claims[member].deciding, -claims[member].progress, member))
        assignment: dict[str, list[ConsumerProtocolMemberAssignment.Assignment]] = {member: [] for member in members}
        topics = sorted({topic for metadata in members.values() for topic in metadata.subscription})
        for topic in topics:
            partitions = sorted(cluster.partitions_for_topic(topic) or ())
            owner = next((member for member in ranked if topic in members[member].subscription), None)
            if owner is not None and partitions:
                assignment[owner].append(ConsumerProtocolMemberAssignment.Assignment(topic, partitions))
        return {
            member: ConsumerProtocolMemberAssignment(self.version, assigned, b"")
            for member, assigned in assignment.items()
        }

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        """Nothing to keep: the claim is the service's."""


def _claim(user_data: bytes) -> DeciderClaim:
    """A member's claim; a member that sent none (another assignor's metadata) claims nothing."""
    if len(user_data) != _CLAIM.size:
        return DeciderClaim()
    deciding, progress = _CLAIM.unpack(user_data)
    return DeciderClaim(deciding, progress)
