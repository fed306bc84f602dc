"""Pauses that double up to a maximum and start over once the thing works."""

from __future__ import annotations

from streamdedup.service.backoff import Backoff


def test_pauses_double_from_the_first_up_to_the_maximum_and_start_over_on_reset() -> None:
    backoff = Backoff(1.0, 5.0)
    assert [backoff.pause() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    backoff.reset()
    assert backoff.pause() == 1.0


def test_at_once_tries_again_without_a_pause_first() -> None:
    backoff = Backoff(1.0, 60.0, at_once=True)
    assert [backoff.pause() for _ in range(4)] == [0.0, 1.0, 2.0, 4.0]
    backoff.reset()
    assert backoff.pause() == 0.0
