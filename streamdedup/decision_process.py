"""The service's decision core, in a worker process of its own: the index and its ``Deduplicator``.

The service's process runs aiokafka, which is pure Python and busy; the decision core is numpy and LMDB with
Python in between. In one process they share one interpreter lock and take turns; with the core in a worker
process (``dedup.workers`` >= 1) each has a core. Calls are served one at a time in the order made, so the
index sees exactly the sequence of batches it would see in-process; a call made while another runs waits in
the worker's pipe, so the worker goes from one batch to the next without waiting for the service's process.
Batches that have queued up there while it decided one (the decider is behind) are decided together, in one
LMDB transaction: the same verdicts (but where a candidate bound binds), and the index's costs per transaction
paid once for all of them.
With ``dedup.workers: 0`` the same calls run in one thread of the service's process instead, one by one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from itertools import accumulate
from pathlib import Path
from typing import Any

from .decide import BatchTimings, Deduplicator, open_index
from .document import Document
from .index import IndexPlan
from .lifecycle import Lifecycle
from .settings import Settings
from .signature import Signatures
from .verdicts import Verdicts
from .workers import WorkerDied, WorkerProcess, served_together

__all__ = ["MOST_BATCHES_TOGETHER", "DecisionProcess", "DecisionProcessDied"]


class DecisionProcessDied(RuntimeError):
    """The decision worker process is gone (killed, out of memory): start a new one and reconcile."""


# Documents cross the process boundary as plain tuples (pickling a named tuple costs about seven times a plain
# one); verdicts as their columns.
_DocumentRow = tuple[str, str, float, "tuple[str, int, int] | None"]
_Decision = tuple[list[_DocumentRow], Mapping[tuple[str, int], int], Signatures | None]
MOST_BATCHES_TOGETHER = 8
"""Most batches decided together: the service has no more than this many fetched and unpublished, so this bounds
a group only where another caller queues more."""


def _unsigned(verdicts: Verdicts) -> Verdicts:
    """The verdicts of a batch its caller signed, without the fingerprints it has already (the largest column by
    far: sent back through the pipe, they kept the decisions waiting on its reader)."""
    return replace(verdicts, fingerprints=verdicts.fingerprints[:, :0])


class _DecisionCore:
    """What runs where the index is open: the index and the deduplicator over it. The worker process is sent its
    methods themselves (functions of the class, importable, so they pickle), called with the core as ``self``."""

    def __init__(self, settings: Settings) -> None:
        self.index = open_index(settings, settings.index.path)
        self.dedup = Deduplicator(settings, self.index)

    def decide_together(self, batches: list[_Decision]) -> list[tuple[Verdicts, BatchTimings]]:
        """Consecutive batches decided as one, in one LMDB transaction: the verdicts are those of deciding them
        one by one but where a candidate bound binds (``dedup.key_capacity``, ``dedup.max_candidates``: a batch
        bounds its own rows among themselves), and the index's costs per transaction (its commit, its merge
        turn) are paid once for all of them."""
        docs = [Document(*row) for rows, _, _ in batches for row in rows]
        # Each batch stored as one of its own: Kafka commits them one by one, and a rollback to the offsets
        # after any of them must undo exactly the later ones.
        ends = list(accumulate(len(rows) for rows, _, _ in batches))
        part_offsets = [(end, offsets) for end, (_, offsets, _) in zip(ends, batches, strict=True)]
        signatures = Signatures.joined(
            [
                self.dedup.signer.sign([row[1] for row in rows]) if signed is None else signed
                for rows, _, signed in batches
            ]
        )
        verdicts = self.dedup.decide(docs, signatures=signatures, part_offsets=part_offsets)
        timings = self.dedup.last_timings
        parts = verdicts.split([len(rows) for rows, _, _ in batches])
        share = len(batches)
        return [
            (
                part if signed is None else _unsigned(part),
                timings.share(len(part) / max(len(docs), 1), share, leads=at == 0, closes=at == share - 1),
            )
            for at, (part, (_, _, signed)) in enumerate(zip(parts, batches, strict=True))
        ]

    @served_together(decide_together, most=MOST_BATCHES_TOGETHER)
    def decide(
        self, rows: list[_DocumentRow], source_offsets: Mapping[tuple[str, int], int], signatures: Signatures | None
    ) -> tuple[Verdicts, BatchTimings]:
        """A batch's decision; in the worker process, batches queued behind one being decided are decided together."""
        docs = [Document(*row) for row in rows]
        verdicts = self.dedup.decide(docs, source_offsets=source_offsets, signatures=signatures)
        return _unsigned(verdicts) if signatures is not None else verdicts, self.dedup.last_timings

    def store(
        self,
        rows: list[_DocumentRow],
        part_offsets: list[tuple[int, Mapping[tuple[str, int], int]]],
        signatures: Signatures | None,
    ) -> None:
        """Documents another decision core kept in one call, stored as it stored them (``Deduplicator.store``)."""
        self.dedup.store([Document(*row) for row in rows], signatures=signatures, part_offsets=part_offsets)

    def source_offsets(self) -> dict[tuple[str, int], int]:
        return self.index.source_offsets()

    def plan(self) -> IndexPlan:
        return self.index.plan

    def rollback(self, offsets: Mapping[tuple[str, int], int]) -> int:
        return self.index.rollback(offsets)

    def maintain(self) -> tuple[int, dict[str, int]]:
        """Expire entries past max_age by the index's own clock; the index's usage."""
        return self.index.expire(), self.index.usage()

    def close(self) -> None:
        self.index.close()


class DecisionProcess(Lifecycle):
    """``start()`` opens the index where the decisions run; ``stop()`` closes it (idempotent). ``plan`` is the
    open index's table plan (what signing workers key batches under)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.path = Path(settings.index.path)
        self._worker: WorkerProcess | None = None
        self._core: _DecisionCore | None = None
        self._thread: ThreadPoolExecutor | None = None  # where the core runs with ``dedup.workers: 0``
        self.plan: IndexPlan | None = None

    @property
    def open(self) -> bool:
        """Whether the index is open where the decisions run: False the moment its worker process dies."""
        return self._core is not None or (self._worker is not None and self._worker.alive)

    @property
    def died(self) -> bool:
        """Started, and its worker process has died since (``stop()`` and ``start()`` replace it)."""
        return self._worker is not None and not self._worker.alive

    @property
    def pid(self) -> int | None:
        """The worker process's id (None without one)."""
        return self._worker.pid if self._worker is not None else None

    async def start(self) -> None:
        if self._worker is not None or self._core is not None:
            return
        if self.settings.dedup.workers == 0:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="streamdedup-decisions")
            try:
                self._core = await asyncio.get_running_loop().run_in_executor(
                    self._thread, _DecisionCore, self.settings
                )
            except BaseException:
                self._thread.shutdown()
                self._thread = None
                raise
            self.plan = self._core.plan()
            return
        # Spawned from the event loop's thread, which lives as long as the process (the death signal).
        self._worker = WorkerProcess(_DecisionCore, (self.settings.detached(),), name="streamdedup-decisions")
        try:
            # The index opens in the worker; the first call returns its errors (incompatible plan, ...).
            self.plan = await self._call("plan")
        except BaseException:
            await asyncio.to_thread(self._worker.stop)
            self._worker = None
            raise

    async def stop(self) -> None:
        worker, core, thread = self._worker, self._core, self._thread
        self._worker, self._core, self._thread = None, None, None
        if core is not None and thread is not None:
            # Behind whatever is still queued there.
            await asyncio.get_running_loop().run_in_executor(thread, core.close)
            thread.shutdown()
        if worker is not None:
            try:
                await asyncio.to_thread(worker.call, _DecisionCore.close)
            except WorkerDied:
                pass  # LMDB keeps every committed batch: there is nothing to close
            finally:
                await asyncio.to_thread(worker.stop)

    def submit(
        self,
        docs: Sequence[Document],
        *,
        source_offsets: Mapping[tuple[str, int], int],
        signatures: Signatures | None,
    ) -> asyncio.Task[tuple[Verdicts, BatchTimings]]:
        """Queue the decision of ``docs`` behind those already queued (``Deduplicator.decide``: kept documents
        and ``source_offsets`` stored in one LMDB transaction); the task gives the verdicts and stage timings.
        Queued, the next batch starts the moment the last one is done, without waiting for this process."""
        # Signed texts are not read again there: spare the pipe their bytes.
        signed = signatures is not None
        rows = [(doc.id, "" if signed else doc.text, doc.time, doc.origin) for doc in docs]
        decision = self._submit("decide", rows, dict(source_offsets), signatures)
        return asyncio.ensure_future(self._verdicts(decision, signatures))

    async def _verdicts(
        self, decision: asyncio.Future[Any], signatures: Signatures | None
    ) -> tuple[Verdicts, BatchTimings]:
        verdicts, timings = await self._died_as_decision_process("decide", decision)
        if signatures is not None:
            verdicts = replace(verdicts, fingerprints=signatures.fingerprints)
        return verdicts, timings

    async def store(
        self,
        docs: Sequence[Document],
        *,
        part_offsets: Sequence[tuple[int, Mapping[tuple[str, int], int]]],
        signatures: Signatures | None,
    ) -> None:
        """Store ``docs`` as kept, deciding nothing (``Deduplicator.store``: the kept documents of consecutive
        batches, given as (end, the source offsets after it), that one call decided), behind the calls already
        queued."""
        signed = signatures is not None
        rows = [(doc.id, "" if signed else doc.text, doc.time, doc.origin) for doc in docs]
        await self._call("store", rows, [(end, dict(offsets)) for end, offsets in part_offsets], signatures)

    async def source_offsets(self) -> dict[tuple[str, int], int]:
        offsets: dict[tuple[str, int], int] = await self._call("source_offsets")
        return offsets

    async def rollback(self, offsets: Mapping[tuple[str, int], int]) -> int:
        removed: int = await self._call("rollback", dict(offsets))
        return removed

    async def maintain(self) -> tuple[int, dict[str, int]]:
        """Expiry by the index's own clock (event time), then the index's usage (``SegmentIndex.usage``)."""
        result: tuple[int, dict[str, int]] = await self._call("maintain")
        return result

    async def _call(self, method: str, *args: Any) -> Any:
        return await self._died_as_decision_process(method, self._submit(method, *args))

    def _submit(self, method: str, *args: Any) -> asyncio.Future[Any]:
        """Queue a call to the core; calls run one at a time, in the order submitted."""
        if self._core is not None:
            return asyncio.get_running_loop().run_in_executor(self._thread, getattr(self._core, method), *args)
        if self._worker is None:
            raise RuntimeError("the decision process is not started")
        return asyncio.wrap_future(self._worker.submit(getattr(_DecisionCore, method), *args))

    @staticmethod
    async def _died_as_decision_process(method: str, call: asyncio.Future[Any]) -> Any:
        try:
            return await call
        except WorkerDied as exc:
            raise DecisionProcessDied(f"the decision process died during {method}") from exc
