"""The garbage collector of a process that handles records a batch of thousands at a time.

CPython collects its youngest generation every 700 net allocations of container objects, which suits objects
that die one by one. A batch's records, documents, futures and headers all live until the batch is done: they
outlive young collections, get promoted, and set off full collections that traverse everything in flight. In
``bench kafka`` that was ~4.7 s of the event loop's time over its rounds (full collections of ~86 ms each).
Young collections every 20,000 net allocations let most of a batch's objects die before one runs; cycles are
still collected, and a full collection still follows ten of the middle generation's. The service's processes
and the offline mode's deciding process run with them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["BATCH_THRESHOLDS", "collecting_for_batches"]

BATCH_THRESHOLDS = (20_000, 10, 10)


@contextmanager
def collecting_for_batches() -> Iterator[None]:
    """Run the block with :data:`BATCH_THRESHOLDS` (process-wide), then restore the thresholds it found."""
    previous = gc.get_threshold()
    gc.set_threshold(*BATCH_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*previous)
