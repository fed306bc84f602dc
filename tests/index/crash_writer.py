"""A writer process for the crash and concurrency tests: adds deterministic batches until killed.

Usage: python -m tests.index.crash_writer PATH LOG [KIND]. KIND ``folds`` (the default): 64-bit fingerprints, whose
tables hold folds; ``entries``: 256-bit ones under a segment plan, whose tables hold entry keys and are swept of
evicted entries' rows. Prints "ready" once the index is open,
then after each committed batch appends its number to LOG (after commit returns, so the log never claims
a batch that was not committed). It resumes after the last committed batch, read from the source offsets.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from streamdedup.index import SegmentIndex
from streamdedup.index.plan import make_segment_plan

BATCH = 200
KEEP_BATCHES = 5
TOPIC = "in"


KINDS = {"folds": (64, 3, None), "entries": (256, 256, make_segment_plan(256, 8))}


def open_index(path: str, kind: str = "folds") -> SegmentIndex:
    bits, radius, plan = KINDS[kind]
    # A 256 KiB map forces map growth (and its retry of the whole batch) during the crash rounds.
    return SegmentIndex(
        path,
        bits,
        radius,
        plan=plan,
        expected_entries=BATCH * KEEP_BATCHES,
        max_entries=BATCH * KEEP_BATCHES,
        time_bucket=1.0,
        map_size=256 * 1024,
    )


def batch(number: int, kind: str = "folds") -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(number)
    fps = rng.integers(0, 2**64 - 1, size=(BATCH, KINDS[kind][0] // 64), dtype=np.uint64, endpoint=True)
    return [f"b{number}-{i}" for i in range(BATCH)], fps


def main(path: str, log: str, kind: str) -> None:
    index = open_index(path, kind)
    number = index.source_offsets().get((TOPIC, 0), 0) // BATCH
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    print("ready", flush=True)
    while True:
        ids, fps = batch(number, kind)
        first = number * BATCH
        index.add(
            ids,
            fps,
            times=np.full(BATCH, float(number)),
            origins=[(TOPIC, 0, first + i) for i in range(BATCH)],
            source_offsets={(TOPIC, 0): first + BATCH},
        )
        os.write(fd, f"{number}\n".encode())
        number += 1


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "folds")
