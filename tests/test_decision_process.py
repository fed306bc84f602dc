"""The decision core in its own process (or thread): the same verdicts, index calls and errors as in-process."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from streamdedup.decide import Deduplicator, open_index
from streamdedup.decision_process import DecisionProcess, DecisionProcessDied
from streamdedup.document import Document
from streamdedup.index.plan import PlanError
from streamdedup.quality.corpus import load_stream
from streamdedup.settings import Settings, load_settings
from streamdedup.signature import Signer

CONFIG = Path(__file__).parents[1] / "config.yaml"


def configured(tmp_path: Path, name: str, workers: int) -> Settings:
    settings = load_settings(CONFIG)
    return settings.model_copy(
        update={
            "index": settings.index.model_copy(update={"path": tmp_path / name}),
            "dedup": settings.dedup.model_copy(update={"workers": workers}),
        }
    )


def batches() -> list[list[Document]]:
    stream = load_stream(split="holdout")[:3000]
    return [
        [Document(d.id, d.text, 1.7e9, ("in", 0, start + i)) for i, d in enumerate(stream[start : start + 1000])]
        for start in range(0, 3000, 1000)
    ]


@pytest.mark.parametrize(
    ("workers", "signed"), [(0, (False,) * 3), (1, (False,) * 3), (1, (True,) * 3), (1, (True, False, True))]
)
async def test_same_verdicts_offsets_rollback_and_stats_as_in_process(
    tmp_path: Path, workers: int, signed: tuple[bool, ...]
) -> None:
    local_settings = configured(tmp_path, "local", workers)
    with open_index(local_settings, tmp_path / "local") as index:
        dedup = Deduplicator(local_settings, index)
        expected = [
            (v.novel, v.reason, v.match_id, v.distance, v.jaccard, v.fingerprint.tolist())
            for n, batch in enumerate(batches())
            for v in dedup.decide(batch, source_offsets={("in", 0): 1000 * (n + 1)})
        ]
        kept_before_last = len(index) - sum(novel for novel, *_ in expected[2000:])

    process = DecisionProcess(configured(tmp_path, "remote", workers))
    async with process:
        # Signed here (as by the signing workers), the texts do not travel to the decision process; a batch
        # whose signing worker died comes unsigned.
        signer = Signer(local_settings.fingerprint, local_settings.dedup, process.plan)
        signatures = [
            signer.sign([doc.text for doc in batch]) if sign else None
            for batch, sign in zip(batches(), signed, strict=False)
        ]
        # All batches queued at once: the worker decides those queued behind the one it decides together, in
        # order, with the verdicts of deciding them one after the other.
        decisions = [
            process.submit(batch, source_offsets={("in", 0): 1000 * (n + 1)}, signatures=signed_batch)
            for n, (batch, signed_batch) in enumerate(zip(batches(), signatures, strict=False))
        ]
        got, together, groups = [], [], []
        for verdicts, timings in await asyncio.gather(*decisions):
            got += [(v.novel, v.reason, v.match_id, v.distance, v.jaccard, v.fingerprint.tolist()) for v in verdicts]
            assert timings.lookup >= 0 and timings.store > 0
            together.append(timings.batches)
            # Each call's first batch leads it, its last closes it, and the call decided as many batches as each of
            # them says.
            part = (timings.batches, timings.closes)
            groups = [*groups, [part]] if timings.leads else [*groups[:-1], [*groups[-1], part]]
        assert got == expected
        assert max(together) > 1 if workers else together == [1, 1, 1]
        assert all(group == [(len(group), False)] * (len(group) - 1) + [(len(group), True)] for group in groups)
        assert await process.source_offsets() == {("in", 0): 3000}
        # Rolling back to offset 2000 removes exactly what the last batch kept.
        assert await process.rollback({("in", 0): 2000}) == sum(novel for novel, *_ in expected[2000:])
        expired, usage = await process.maintain()
        assert expired == 0 and usage["entries"] == kept_before_last
        assert 0 < usage["disk_bytes"] <= usage["map_size"]
        assert await process.source_offsets() == {("in", 0): 2000}
    await process.stop()  # idempotent
    assert not process.open
    with pytest.raises(RuntimeError, match="not started"):
        await process.source_offsets()


@pytest.mark.parametrize(("workers", "signed"), [(0, False), (1, False), (1, True)])
async def test_documents_stored_as_kept_there_make_the_index_of_the_core_that_kept_them(
    tmp_path: Path, workers: int, signed: bool
) -> None:
    settings = configured(tmp_path, "decided", workers)
    # The first two batches decided in one call, the third in another.
    calls = [batches()[:2], batches()[2:]]
    kept: list[tuple[list[Document], list[tuple[int, dict[tuple[str, int], int]]]]] = []
    with open_index(settings, tmp_path / "decided") as index:
        dedup = Deduplicator(settings, index)
        decided = 0
        for call in calls:
            ends = [sum(map(len, call[: at + 1])) for at in range(len(call))]
            part_offsets = [(end, {("in", 0): 1000 * (decided + at + 1)}) for at, end in enumerate(ends)]
            decided += len(call)
            docs = [doc for batch in call for doc in batch]
            stored = dedup.decide(docs, part_offsets=part_offsets).stored
            kept_ends = [int(np.count_nonzero(stored[:end])) for end in ends]
            kept.append(
                (
                    [doc for doc, keep in zip(docs, stored.tolist(), strict=True) if keep],
                    [(end, offsets) for end, (_, offsets) in zip(kept_ends, part_offsets, strict=True)],
                )
            )
        expected = list(index.export())
        expected_stats = {key: index.stats()[key] for key in ("entries", "staged_rows", "clock")}
    assert 0 < len(expected) < 3000
    process = DecisionProcess(configured(tmp_path, "stored", workers))
    async with process:
        signer = Signer(settings.fingerprint, settings.dedup, process.plan)
        for docs, parts in kept:
            signatures = signer.sign([doc.text for doc in docs]) if signed else None
            await process.store(docs, part_offsets=parts, signatures=signatures)
        assert await process.source_offsets() == {("in", 0): 3000}
    with open_index(settings, tmp_path / "stored") as index:
        assert list(index.export()) == expected
        assert {key: index.stats()[key] for key in expected_stats} == expected_stats


async def test_an_index_that_cannot_open_fails_start_with_its_own_error(tmp_path: Path) -> None:
    settings = configured(tmp_path, "index", 1)
    with open_index(settings, tmp_path / "index"):
        pass
    wider = settings.model_copy(
        update={"fingerprint": settings.fingerprint.model_copy(update={"width": 512, "segments": 16})}
    )
    process = DecisionProcess(wider)
    with pytest.raises(PlanError, match="incompatible"):
        await process.start()
    assert not process.open


async def test_a_killed_decision_process_reads_as_closed_at_once_and_a_restart_keeps_what_it_committed(
    tmp_path: Path,
) -> None:
    process = DecisionProcess(configured(tmp_path, "index", 1))
    first = batches()[0]
    async with process:
        verdicts, _ = await process.submit(first, source_offsets={("in", 0): 1000}, signatures=None)
        assert process.open and not process.died
        killed = process.pid
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while process.open and time.monotonic() < deadline:  # no call is made: the death alone shows
            await asyncio.sleep(0.02)
        assert not process.open and process.died
        with pytest.raises(DecisionProcessDied, match="during source_offsets"):
            await process.source_offsets()
        await process.stop()
        assert not process.died
        await process.start()
        assert process.open and process.pid not in (None, killed)
        assert await process.source_offsets() == {("in", 0): 1000}
        # Everything kept before the kill is still there: copies of the batch under new ids are all dropped.
        copies = [Document(f"copy-{doc.id}", doc.text, doc.time, ("in", 0, 1000 + i)) for i, doc in enumerate(first)]
        again, _ = await process.submit(copies, source_offsets={("in", 0): 2000}, signatures=None)
    assert sum(verdicts.novel) > 500
    assert not any(again.novel)
