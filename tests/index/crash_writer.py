"""A writer process for the crash and concurrency tests: adds deterministic batches until killed.

Usage: python -m tests.index.crash_writer PATH LOG [rlimit_bytes]. Prints "ready" once the index is open,
then after each committed batch appends its number to LOG (after commit returns, so the log never claims
a batch that was not committed). It resumes after the last committed batch, read from the source offsets.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from streamdedup.index import SegmentIndex

BATCH = 200
KEEP_BATCHES = 5
TOPIC = "in"


def open_index(path: str) -> SegmentIndex:
    # A 256 KiB map forces map growth (and its retry of the whole batch) during the crash rounds.
    return SegmentIndex(
        path, 64, 3, expected_entries=BATCH * KEEP_BATCHES, max_entries=BATCH * KEEP_BATCHES,
        time_bucket=1.0, map_size=256 * 1024,
    )


def batch(number: int) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(number)
    fps = rng.integers(0, 2**64 - 1, size=(BATCH, 1), dtype=np.uint64, endpoint=True)
    return [f"b{number}-{i}" for i in range(BATCH)], fps


def main(path: str, log: str) -> None:
    index = open_index(path)
    number = index.source_offsets().get((TOPIC, 0), 0) // BATCH
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    print("ready", flush=True)
    while True:
        ids, fps = batch(number)
        first = number * BATCH
        index.add(
            ids, fps, times=np.full(BATCH, float(number)),
            origins=[(TOPIC, 0, first + i) for i in range(BATCH)],
            source_offsets={(TOPIC, 0): first + BATCH},
        )
        os.write(fd, f"{number}\n".encode())
        number += 1


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
