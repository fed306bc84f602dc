"""The batch-sized garbage collector thresholds: set for the block, restored after it, whatever happens."""

from __future__ import annotations

import gc

import pytest

from streamdedup.garbage import BATCH_THRESHOLDS, collecting_for_batches


def test_thresholds_hold_inside_the_block_and_are_restored_even_after_an_error() -> None:
    found = gc.get_threshold()
    assert found != BATCH_THRESHOLDS
    with collecting_for_batches():
        assert gc.get_threshold() == BATCH_THRESHOLDS
    assert gc.get_threshold() == found
    with pytest.raises(KeyError), collecting_for_batches():
        raise KeyError("a failure inside")
    assert gc.get_threshold() == found


def test_collections_wait_for_a_batchs_worth_of_allocations() -> None:
    # 5,000 live containers: several young collections at Python's default, none at the batch thresholds.
    def young_collections_while_allocating() -> int:
        gc.collect()
        before = sum(generation["collections"] for generation in gc.get_stats())
        batch = [{"record": i} for i in range(5_000)]
        assert len(batch) == 5_000
        return sum(generation["collections"] for generation in gc.get_stats()) - before

    assert young_collections_while_allocating() >= 5
    with collecting_for_batches():
        assert young_collections_while_allocating() == 0
