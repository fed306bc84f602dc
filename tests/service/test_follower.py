"""The follower's calls: the verdict records of one of the decider's calls, stored together as the call stored
them (the service-level following runs on the real broker in ``tests/test_scale_out.py``)."""

from __future__ import annotations

import numpy as np

from streamdedup.kafka.verdict_records import BatchVerdicts
from streamdedup.service.follower import first_call, unbroken


def batch(first: int, end: int, leads: bool, closes: bool) -> BatchVerdicts:
    return BatchVerdicts(first, end, leads, closes, np.ones(end - first, dtype=bool))


def spans(call: list[BatchVerdicts] | None) -> list[tuple[int, int]] | None:
    return None if call is None else [(each.first, each.end) for each in call]


def test_a_call_runs_from_the_batch_that_began_it_to_the_one_that_ended_it() -> None:
    pending = [batch(0, 2, True, False), batch(3, 4, False, False), batch(4, 6, False, True), batch(6, 7, True, True)]
    assert spans(first_call(pending, complete=False)) == [(0, 2), (3, 4), (4, 6)]
    assert spans(first_call(pending[3:], complete=False)) == [(6, 7)]


def test_a_call_whose_end_is_not_readable_yet_waits_unless_its_decider_is_fenced() -> None:
    pending = [batch(0, 2, True, False), batch(3, 4, False, False)]
    assert first_call(pending, complete=False) is None
    assert spans(first_call(pending, complete=True)) == [(0, 2), (3, 4)]


def test_a_call_its_decider_left_unfinished_ends_where_another_begins() -> None:
    # Its decider died after committing two of its batches; the next decider's first call follows.
    pending = [batch(0, 2, True, False), batch(3, 4, False, False), batch(5, 6, True, True)]
    assert spans(first_call(pending, complete=False)) == [(0, 2), (3, 4)]


def test_a_call_stops_before_records_no_batch_of_it_covers() -> None:
    call = [batch(0, 2, True, False), batch(3, 4, False, False), batch(6, 7, False, True)]
    # Offsets between batches that hold no record are transaction markers: the call is whole.
    assert spans(unbroken(call, [0, 1, 3, 6])) == [(0, 2), (3, 4), (6, 7)]
    # A record at 5 that no batch covers (its verdict record was unreadable): the call stops before it.
    assert spans(unbroken(call, [0, 1, 3, 5, 6])) == [(0, 2), (3, 4)]
