"""The decider group's assignor: the sequence partition stays with the instance that decides, or goes to the one
whose index has followed furthest."""

from __future__ import annotations

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from streamdedup.kafka.decider_assignor import DeciderAssignor, DeciderClaim


class _Cluster(ClusterMetadata):
    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0}


def members(**claims: DeciderClaim | None) -> dict[str, ConsumerProtocolMemberMetadata]:
    """Each member's join metadata, as its own assignor makes it (None: a member that sends no claim)."""
    found = {}
    for member, claim in claims.items():
        if claim is None:
            found[member] = ConsumerProtocolMemberMetadata(0, ["seq"], b"")
        else:
            found[member] = DeciderAssignor(claim).metadata(["seq"])
    return found


def owner(joined: dict[str, ConsumerProtocolMemberMetadata]) -> list[str]:
    assignment = DeciderAssignor(DeciderClaim()).assign(_Cluster(), joined)
    assert set(assignment) == set(joined)  # every member gets an assignment, most an empty one
    return [member for member, given in assignment.items() if any(part.partitions == [0] for part in given.assignment)]


def test_the_instance_that_decides_keeps_the_partition_whoever_joins() -> None:
    assert owner(members(a=DeciderClaim(False, 900), b=DeciderClaim(True, 10), c=DeciderClaim(False, 0))) == ["b"]


def test_without_a_decider_the_index_furthest_along_takes_it() -> None:
    assert owner(members(a=DeciderClaim(False, 10), b=DeciderClaim(False, 0), c=DeciderClaim(False, 900))) == ["c"]
    # Among equals, the smallest member id; a member that sends no claim counts as nothing done.
    assert owner(members(b=DeciderClaim(False, 5), a=DeciderClaim(False, 5), c=None)) == ["a"]
    assert owner(members(c=None)) == ["c"]


def test_a_claim_reads_as_it_is_at_each_join() -> None:
    claim = DeciderClaim()
    assignor = DeciderAssignor(claim)
    before = assignor.metadata(["seq"]).user_data
    claim.deciding, claim.progress = True, 12345
    assert assignor.metadata(["seq"]).user_data != before
    assert owner({"x": assignor.metadata(["seq"]), **members(y=DeciderClaim(False, 99999))}) == ["x"]
