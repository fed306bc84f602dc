"""The partition ownership state machine: the moves it allows, the ones it refuses, and what it answers."""

from __future__ import annotations

import pytest
from aiokafka import TopicPartition

from streamdedup.service.partition_ownership import IllegalTransition, Ownership, PartitionOwnership

BOTH = frozenset({TopicPartition("in", 0), TopicPartition("in", 1)})
ONE = frozenset({TopicPartition("in", 0)})


def owning() -> PartitionOwnership:
    ownership = PartitionOwnership()
    ownership.connect()
    ownership.assign(BOTH)
    ownership.reconcile()
    ownership.own(BOTH)
    return ownership


def test_a_session_goes_from_disconnected_through_reconciling_to_owning() -> None:
    ownership = PartitionOwnership()
    assert (ownership.state, ownership.connected) == (Ownership.DISCONNECTED, False)
    assert not ownership.partitions_assigned
    ownership.connect()
    assert (ownership.state, ownership.connected) == (Ownership.UNASSIGNED, True)
    assert ownership.rebalanced(frozenset())
    ownership.assign(BOTH)
    assert (ownership.state, ownership.partitions_assigned) == (Ownership.ASSIGNED, True)
    assert ownership.rebalanced(BOTH)
    ownership.reconcile()
    assert ownership.rebalanced(BOTH)
    ownership.own(BOTH)
    assert (ownership.state, ownership.rebalanced(BOTH)) == (Ownership.OWNING, False)


def test_an_assignment_other_than_the_reconciled_one_is_a_rebalance_before_the_listener_runs() -> None:
    ownership = owning()
    assert ownership.rebalanced(ONE)
    assert not ownership.rebalanced(BOTH)


def test_a_partial_assignment_is_split_not_ready_and_reconciled_again_when_reassigned() -> None:
    ownership = PartitionOwnership()
    ownership.connect()
    ownership.assign(ONE)
    ownership.reconcile()
    ownership.split(ONE)
    assert (ownership.state, ownership.partitions_assigned) == (Ownership.SPLIT, False)
    assert not ownership.rebalanced(ONE)
    ownership.assign(BOTH)
    assert ownership.rebalanced(BOTH)
    ownership.reconcile()
    ownership.own(BOTH)
    assert ownership.state is Ownership.OWNING


def test_paused_for_a_failed_batch_keeps_the_partitions_and_resumes_to_owning() -> None:
    ownership = owning()
    ownership.pause()
    ownership.pause()  # each retry of the batch pauses again
    assert (ownership.state, ownership.partitions_assigned) == (Ownership.PAUSED, True)
    assert not ownership.rebalanced(BOTH)
    ownership.resume()
    assert ownership.state is Ownership.OWNING


@pytest.mark.parametrize("state", [Ownership.OWNING, Ownership.PAUSED, Ownership.SPLIT, Ownership.RECONCILING])
def test_a_rebalance_interrupts_any_connected_state(state: Ownership) -> None:
    ownership = owning()
    ownership.state = state
    ownership.assign(ONE)
    assert (ownership.state, ownership.assigned) == (Ownership.ASSIGNED, ONE)
    ownership.revoke()
    assert (ownership.state, ownership.assigned) == (Ownership.UNASSIGNED, frozenset())
    assert not ownership.partitions_assigned


def test_disconnecting_forgets_the_assignment_from_any_state() -> None:
    ownership = owning()
    ownership.disconnect()
    assert (ownership.state, ownership.assigned, ownership.reconciled) == (Ownership.DISCONNECTED, frozenset(), None)
    ownership.disconnect()
    assert ownership.state is Ownership.DISCONNECTED


@pytest.mark.parametrize(
    ("state", "move"),
    [
        (Ownership.DISCONNECTED, "revoke"),
        (Ownership.DISCONNECTED, "reconcile"),
        (Ownership.DISCONNECTED, "pause"),
        (Ownership.UNASSIGNED, "connect"),
        (Ownership.ASSIGNED, "pause"),
        (Ownership.ASSIGNED, "resume"),
        (Ownership.RECONCILING, "pause"),
        (Ownership.OWNING, "resume"),
        (Ownership.SPLIT, "pause"),
    ],
)
def test_illegal_moves_raise_and_leave_the_state_as_it_was(state: Ownership, move: str) -> None:
    ownership = PartitionOwnership()
    ownership.state = state
    with pytest.raises(IllegalTransition, match=f"{state.name} -> "):
        getattr(ownership, move)()
    assert ownership.state is state


@pytest.mark.parametrize("state", [Ownership.ASSIGNED, Ownership.OWNING, Ownership.PAUSED, Ownership.SPLIT])
def test_only_reconciliation_ends_in_owning_or_split(state: Ownership) -> None:
    ownership = PartitionOwnership()
    ownership.state = state
    with pytest.raises(IllegalTransition):
        ownership.own(BOTH)
    with pytest.raises(IllegalTransition):
        ownership.split(ONE)
