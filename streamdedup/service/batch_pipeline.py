"""The batch pipeline: consume -> decode -> sign -> decide -> publish, batch after batch, and what it does when
the decision process dies deciding a batch or the index cannot store one.

One batch: ``getmany`` -> decode -> sign (fingerprint and sketch, in the signing worker processes) ->
``Deduplicator.decide`` in the ``DecisionProcess`` (one LMDB transaction: the kept fingerprints and the input
offsets after the batch) -> one Kafka transaction (novel records, duplicates, dead letters and the input
offsets) -> commit. Batch N+1 is decided while batch N's transaction commits and the workers sign batch N+2
when it is already fetched: the three stages use both cores.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Future
from functools import reduce
from operator import attrgetter
from typing import cast

import numpy as np
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from ..decide import BatchTimings
from ..decision_process import DecisionProcess, DecisionProcessDied
from ..document import Document, DocumentDecoder
from ..index import STORAGE_ERRORS
from ..kafka.consumer import BatchConsumer
from ..kafka.producer import TransactionalProducer
from ..kafka.verdict_records import BatchVerdicts
from ..lifecycle import StopRequest
from ..metrics import PartitionLag, ServiceMetrics, Stage, index_capacity_bytes
from ..settings import Settings
from ..signature import Signatures, signing_id
from ..verdicts import Verdicts
from .backoff import Backoff
from .batch import BatchOutput, Decided, Decision, Prepared, crashed
from .origins import Carried, Origin, Origins
from .partition_ownership import Ownership, PartitionOwnership
from .signer_supervisor import SignerSupervisor
from .stats import DeadLetterLog, ServiceStats

__all__ = ["BatchPipeline"]

log = logging.getLogger(__name__)

# Index size gauges read LMDB statistics; refreshing them every batch would cost more than it tells.
_INDEX_STATS_INTERVAL_SECONDS = 5.0
# Fetched batches not yet handed to their Kafka transaction: one waiting for its verdicts, the next ones signed
# and queued in the decision process as soon as they are signed, so neither the decision process nor the
# signing workers wait for this process's turn. A decision process that falls behind decides the batches queued
# there together, which costs it less a batch: room for several lets it catch up.
_UNPUBLISHED_BATCHES = 8
# While consumption is paused (the index refuses batches, a decision process is replaced), the consumer is polled
# this often: one that does not poll for max.poll.interval.ms (5 minutes) leaves the group.
_PAUSED_POLL_SECONDS = 1.0
# The first duplicates the running totals keep as examples (the demo prints them).
_EXAMPLES = 5
_TOPIC = attrgetter("topic")

# What a batch is retried after: a storage error (full map or disk), or the decision process dying.
_RECOVERABLE: tuple[type[Exception], ...] = (*STORAGE_ERRORS, DecisionProcessDied)


class _Interrupted(Exception):
    """A stop or a rebalance cut short the recovery of a batch: it is fetched again from the committed offsets."""


class BatchPipeline:
    """Runs batches through the stages while this instance owns every input partition (``run``); decides the
    batches that reconciliation replays (``replay``). The rebalance listener takes ``batch_lock`` to change
    the ownership, so that no batch is published for partitions that moved."""

    def __init__(
        self,
        settings: Settings,
        *,
        metrics: ServiceMetrics,
        stats: ServiceStats,
        decisions: DecisionProcess,
        signers: SignerSupervisor,
        ownership: PartitionOwnership,
        dead_letters: DeadLetterLog,
        stop: StopRequest,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._stats = stats
        self._decisions = decisions
        self._signers = signers
        self._ownership = ownership
        self._dead_letters = dead_letters
        self._stop = stop
        self._decoder = DocumentDecoder(settings.input)
        self.origins = Origins(sequenced=settings.kafka.sequence_topic is not None)
        self._signing = signing_id(settings.fingerprint, settings.dedup)
        self.output = BatchOutput(settings)
        self.batch_lock = asyncio.Lock()
        self._in_flight: asyncio.Task[None] | None = None
        self._index_stats_at = 0.0
        # Why the index refuses batches (full map or disk), None while it stores them; the next pause after one.
        self.storage_error: str | None = None
        self._storage_backoff = Backoff(settings.kafka.retry_backoff_seconds, settings.kafka.retry_backoff_max_seconds)
        # The pause before the next decision process starts: none after one that decided something, then doubling.
        self._death_backoff = Backoff(
            settings.kafka.retry_backoff_seconds, settings.kafka.retry_backoff_max_seconds, at_once=True
        )
        # The batch the decision process died deciding, and how many times.
        self._dying: tuple[Prepared, int] | None = None

    async def run(self, consumer: BatchConsumer, producer: TransactionalProducer) -> bool:
        """Run batches until the consumer's assignment is not the one the index was reconciled with (True: the
        caller reconciles and runs again) or a stop (False).

        Batches flow through the stages at once: batch N's Kafka transaction commits while the decision
        process decides the next ones and the workers sign those fetched after them. Each batch goes to the
        decision process the moment it is signed and the one before it was queued there (``_submitted_after``),
        so waiting for one batch's verdicts holds up neither signing nor deciding. The decision process goes
        from one batch to the next without waiting for this process. Transactions stay one at a time, in order.

        The index may then run up to ``_UNPUBLISHED_BATCHES`` batches ahead of Kafka, which reconciliation undoes
        like one. Verdicts go to Kafka only under the batch lock after a rebalance check: after a rebalance,
        nothing more is fetched, decided batches are not published, and reconciliation (once every batch
        fetched is decided) rolls the index back so that they are fetched again from the committed offsets.
        """
        unpublished: _Unpublished = deque()

        def enqueue(records: Sequence[ConsumerRecord]) -> None:
            previous = unpublished[-1][1] if unpublished else None
            prepared = self._prepare(records)
            unpublished.append((prepared, asyncio.create_task(self._submitted_after(previous, prepared))))

        try:
            while unpublished or not self._stop.is_set():
                if not unpublished:
                    records = await consumer.batch()
                    # aiokafka may hand out records of a new assignment before the rebalance listener ran:
                    # nothing is processed until the index is reconciled with exactly the current assignment.
                    # Records fetched before that are dropped here and fetched again from the committed offsets.
                    if self._rebalanced(consumer):
                        await self._settle()
                        return True
                    if self._ownership.state is Ownership.SPLIT or not records:
                        await self._settle()  # nothing else to do: finish the open transaction now
                        self._dead_letters.flush_due()
                        if self._decisions.died:
                            # Found between polls, not at the next batch: an idle stream gets a new one too.
                            raise DecisionProcessDied("the decision process died while the input was idle")
                        continue
                    enqueue(records)
                    continue
                while (
                    len(unpublished) < _UNPUBLISHED_BATCHES
                    and not self._stop.is_set()
                    and not self._rebalanced(consumer)
                    and (following := await consumer.batch(wait=False))
                ):
                    enqueue(following)
                prepared, submission = unpublished[0]
                try:
                    decision = await (await submission)
                except _RECOVERABLE as exc:
                    await self._recover(consumer, unpublished, exc)
                    continue
                except _Interrupted:
                    await self._drained(unpublished)
                    unpublished.clear()
                    continue
                self._death_backoff.reset()  # the decision process decides: a next death replaces it at once
                self._recovered(consumer)
                unpublished.popleft()
                async with self.batch_lock:
                    if self._rebalanced(consumer):
                        continue
                    decided = self.output.decided(prepared, decision)
                    await self._settle()
                    self._in_flight = asyncio.create_task(self._publish(decided, consumer, producer))
        finally:
            # Decided but not published: reconciliation undoes them. Their own failures are not this one's.
            submissions = await asyncio.gather(*(submission for _, submission in unpublished), return_exceptions=True)
            decisions = [decision for decision in submissions if isinstance(decision, asyncio.Task)]
            await asyncio.gather(*decisions, return_exceptions=True)
            await self._settle()
        return False

    async def _submitted_after(
        self, previous: asyncio.Task[asyncio.Future[Decision]] | None, prepared: Prepared
    ) -> asyncio.Future[Decision]:
        """Queue ``prepared`` in the decision process once it is signed and ``previous`` (the batch fetched
        before it) is queued there: the index sees the batches in the order fetched. A batch behind one that
        failed to be queued fails with it."""
        if previous is not None:
            await previous
        return await self._submit_decision(prepared)

    async def replay(self, records: Sequence[ConsumerRecord]) -> None:
        """Decide ``records`` into the index, publishing nothing: reconciliation replays what the index lacks."""
        await self._verdicts(self._prepare(records))

    async def store(self, call: Sequence[BatchVerdicts], fetched: Sequence[ConsumerRecord], after: int) -> None:
        """Store in the index what one of the decider's calls stored of ``fetched`` (the sequence records of the
        call's batches, whose verdict records ``call`` holds) from sequence offset ``after`` on, as that call
        stored it: in one transaction, a part per batch. Nothing is decided or published, but a batch whose
        records do not match its verdicts (an instance configured otherwise, a damaged record): it is decided
        instead, loudly, and the batches around it are stored apart."""
        await self._maintain_index()
        documents: list[Document] = []
        signed: list[Signatures | None] = []
        parts: list[tuple[int, dict[tuple[str, int], int]]] = []
        for verdicts in call:
            prepared = self._prepare([record for record in fetched if verdicts.first <= record.offset < verdicts.end])
            where = f"sequence offsets {verdicts.first}..{verdicts.end - 1}"
            if len(verdicts.stored) != len(prepared.records):
                log.error(
                    "the decider's verdicts of %s name %d input records, the sequence topic holds %d there; "
                    "deciding them instead",
                    where,
                    len(verdicts.stored),
                    len(prepared.records),
                )
                await self._stored(documents, signed, parts)
                documents, signed, parts = [], [], []
                await self._verdicts(prepared)
                continue
            signatures = await self._signers.signatures(prepared.signing)
            indexable = np.ones(len(prepared.rows), dtype=bool) if signatures is None else signatures.indexable
            lost = np.count_nonzero(verdicts.stored) - np.count_nonzero(verdicts.stored[prepared.rows] & indexable)
            if lost:
                log.error(
                    "the decider stored %d documents of %s that this instance cannot decode or sign alike (is "
                    "every instance configured alike?); this index lacks them",
                    lost,
                    where,
                )
            due = verdicts.stored
            if after > verdicts.first:
                # The index holds the batch's first sequence records already (it was cut there): not again.
                offsets = np.fromiter((origin[2] for origin in prepared.origins), np.int64, len(prepared.origins))
                due = due & (offsets >= self.origins.index_offset(after))
            keep = np.flatnonzero(due[prepared.rows] & indexable).tolist()
            documents += [prepared.documents[row] for row in keep]
            signed.append(None if signatures is None else signatures.subset(keep))
            parts.append((len(documents), self._index_offsets(prepared.next_offsets)))
        await self._stored(documents, signed, parts)

    async def _stored(
        self,
        documents: list[Document],
        signed: list[Signatures | None],
        parts: list[tuple[int, dict[tuple[str, int], int]]],
    ) -> None:
        """Store the kept documents of consecutive batches (``parts``) in one transaction."""
        if parts:
            joined = None if any(each is None for each in signed) else Signatures.joined(cast(list[Signatures], signed))
            await self._decisions.store(documents, part_offsets=parts, signatures=joined)

    async def in_flight_ended(self) -> None:
        """Wait for the Kafka transaction in flight, if any; its failure is left in it for ``run`` to raise."""
        if self._in_flight is not None:
            await asyncio.wait([self._in_flight])

    # ------------------------------------------------------------------ a batch that failed

    async def _recover(self, consumer: BatchConsumer, unpublished: _Unpublished, error: Exception) -> None:
        """The first unpublished batch failed: the decision process died deciding it, or the index could not
        store it (its map at ``index.max_map_size_bytes``, its disk full). Nothing more is fetched (the group keeps
        this member, the batches fetched wait here unpublished) and, after a pause that doubles with each failure,
        the index is rolled back to the first unpublished record of each partition (undoing what a dying process
        or a later batch stored) and the batches are queued again in order. A batch the decision process died on
        is decided alone; once it killed it twice, in parts (:meth:`_decided_apart`). A stop or a rebalance drops
        them instead: they are fetched again from the committed offsets."""
        await self._settle()
        await self._drained(unpublished)
        head = unpublished[0][0]
        if isinstance(error, DecisionProcessDied):
            deaths = self._dying[1] + 1 if self._dying is not None and self._dying[0] is head else 1
            self._dying = (head, deaths)
        while True:
            if isinstance(error, DecisionProcessDied):
                pause = self.decision_died(error)
            else:
                pause = self.storage_failed(error)
                await self._maintain_index(force=True)  # the gauges the alerts read; expiry may make room
            if not await self._paused_for(consumer, pause):
                unpublished.clear()
                return
            try:
                if not self._decisions.open:
                    await self.restart_decisions()
                await self._decisions.rollback(
                    _first_offsets(origin for prepared, _ in unpublished for origin in prepared.origins)
                )
            except _RECOVERABLE as exc:
                error = exc
                continue
            break
        batches = [prepared for prepared, _ in unpublished]
        unpublished.clear()
        previous: asyncio.Task[asyncio.Future[Decision]] | None = None
        for prepared in batches:
            if previous is None and self._dying is not None and self._dying[0] is prepared:
                if self._dying[1] < 2:
                    work = self._decided_alone(prepared)
                else:
                    work = self._done(self._decided_apart(prepared, lambda pause: self._paused_for(consumer, pause)))
            else:
                work = self._submitted_after(previous, prepared)
            previous = asyncio.create_task(work)
            unpublished.append((prepared, previous))

    def _recovered(self, consumer: BatchConsumer) -> None:
        """The first unpublished batch has its verdicts: fetching resumes."""
        self._dying = None
        if self.storage_error is not None:
            log.warning("the index stores batches again; consuming again")
            self.storage_error = None
            self._storage_backoff.reset()
            self._metrics.record_storage(failed=False)
        if self._ownership.state is Ownership.PAUSED:
            consumer.resume(consumer.assignment())
            self._ownership.resume()

    def storage_failed(self, error: Exception) -> float:
        """Record that the index refused a batch; the pause before the next attempt."""
        pause = self._storage_backoff.pause()
        self.storage_error = f"{type(error).__name__}: {error}"
        self._metrics.record_storage(failed=True)
        log.error(
            "THE INDEX CANNOT STORE THE BATCH (%s): consumption paused, not ready; trying again in %.1f s "
            "(free space on the index's volume, or raise index.max_map_size_bytes and restart)",
            self.storage_error,
            pause,
        )
        return pause

    def decision_died(self, error: Exception) -> float:
        """Record a death of the decision process; the pause before the next one starts."""
        pause = self._death_backoff.pause()
        self._metrics.record_worker_death("decision")
        log.error("%s; starting a new one in %.1f s", error, pause)
        return pause

    async def restart_decisions(self) -> None:
        await self._decisions.stop()
        await self._decisions.start()

    async def _paused_for(self, consumer: BatchConsumer, seconds: float) -> bool:
        """Wait ``seconds`` fetching nothing: every assigned partition paused, the consumer polled now and then
        so that the group keeps this member. False when a stop or a rebalance cut the wait short."""
        if self._stop.is_set() or self._rebalanced(consumer):
            return False
        consumer.pause(consumer.assignment())
        self._ownership.pause()
        deadline = time.monotonic() + seconds
        while not (self._stop.is_set() or self._rebalanced(consumer)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            await self._stop.sleep(min(remaining, _PAUSED_POLL_SECONDS))
            await consumer.batch(wait=False)
        return False

    @staticmethod
    async def _drained(unpublished: _Unpublished) -> None:
        """Wait until every unpublished batch's decision has ended, whatever its outcome."""
        submissions = await asyncio.gather(*(submission for _, submission in unpublished), return_exceptions=True)
        await asyncio.gather(*(s for s in submissions if isinstance(s, asyncio.Future)), return_exceptions=True)

    async def _decided_alone(self, prepared: Prepared) -> asyncio.Future[Decision]:
        """The batch's decision, queued only once it is over: no later batch shares the process with it."""
        decision = await self._submit_decision(prepared)
        await asyncio.wait([decision])
        return decision

    @staticmethod
    async def _done(verdicts: Awaitable[Verdicts]) -> asyncio.Future[Decision]:
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        future.set_result(Decision(await verdicts))
        return future

    async def _decided_apart(self, prepared: Prepared, wait: Callable[[float], Awaitable[bool]]) -> Verdicts:
        """The verdicts of a batch whose decision killed the decision process twice, decided in parts on fresh
        processes: a part that kills it is halved, down to the documents that kill it alone. Those get the crash
        as their error (dead-lettered as ``decide_crash``, not stored); the others get the verdicts they get in
        one batch, as the decision core's do not depend on batch boundaries but where a candidate bound binds.
        The batch's input offsets are stored once every part is decided. ``wait(pause)`` waits before each new
        process, False to give up."""
        documents = prepared.documents
        offsets = self._index_offsets(prepared.next_offsets)
        signatures = await self._signers.signatures(prepared.signing)
        width = self._settings.fingerprint.width
        parts: list[Verdicts] = []
        count = len(documents)
        todo = [(count // 2, count), (0, count // 2)] if count > 1 else []
        if count == 1:
            log.error("document %r kills the decision process; dead-lettering it", documents[0].id)
            parts.append(crashed(width))
        while todo:
            low, high = todo.pop()
            part = None if signatures is None else signatures.subset(slice(low, high))
            try:
                verdicts, _ = await self._decisions.submit(documents[low:high], source_offsets={}, signatures=part)
            except DecisionProcessDied as exc:
                if not await wait(self.decision_died(exc)):
                    raise _Interrupted from exc
                await self.restart_decisions()
                origins = (doc.origin for doc in documents[low:high] if doc.origin is not None)
                await self._decisions.rollback(_first_offsets(origins))
                if high - low == 1:
                    log.error("document %r kills the decision process; dead-lettering it", documents[low].id)
                    parts.append(crashed(width))
                else:
                    middle = (low + high) // 2
                    todo += [(middle, high), (low, middle)]
                continue
            self._death_backoff.reset()
            parts.append(verdicts)
        # Nothing left that can kill it: the offsets of a batch without documents.
        empty, _ = await self._decisions.submit([], source_offsets=offsets, signatures=None)
        return reduce(Verdicts.joined, parts, empty)

    def _rebalanced(self, consumer: BatchConsumer) -> bool:
        return self._ownership.rebalanced(consumer.assignment())

    async def _settle(self) -> None:
        """Wait for the transaction in flight; its failure ends the session (the caller recreates clients)."""
        task, self._in_flight = self._in_flight, None
        if task is not None:
            await task

    def _prepare(self, fetched: Sequence[ConsumerRecord]) -> Prepared:
        """Decode a fetched batch and hand its texts to the signing workers; nothing is decided yet."""
        started = time.perf_counter()
        carried = self.origins.carried(fetched)
        records, origins = carried.records, carried.origins
        clamped = self._decoder.clamped_times
        decoded, rows = self.output.decoded(self._decoder, carried)
        self._metrics.record_clamped_times(self._decoder.clamped_times - clamped)
        documents = [cast(Document, decoded[row]) for row in rows]
        # Plain tuples per record (a TopicPartition is several times dearer to build), one per partition after.
        last_offsets = {(record.topic, record.partition): record.offset for record in fetched}
        next_offsets = {TopicPartition(*partition): offset + 1 for partition, offset in last_offsets.items()}
        signing = self._signed(carried, rows) or self._signers.submit([doc.text for doc in documents])
        return Prepared(fetched, records, origins, decoded, rows, documents, next_offsets, signing, started)

    def _signed(self, carried: Carried, rows: list[int]) -> Future[Signatures] | None:
        """The signatures the sequencing instances made of these records' documents, if they made them all
        as this instance would."""
        signatures = carried.signatures(rows, self._signing)
        if signatures is None:
            return None
        done: Future[Signatures] = Future()
        done.set_result(signatures)
        return done

    def _index_offsets(self, next_offsets: dict[TopicPartition, int]) -> dict[tuple[str, int], int]:
        """The offsets the index keeps for these offsets of fetched partitions."""
        return {(tp.topic, tp.partition): self.origins.index_offset(offset) for tp, offset in next_offsets.items()}

    async def _verdicts(self, prepared: Prepared) -> Verdicts:
        """The batch's verdicts, its kept documents and input offsets stored in one LMDB transaction."""
        return (await (await self._submit_decision(prepared))).verdicts

    async def _submit_decision(self, prepared: Prepared) -> asyncio.Task[Decision]:
        """Once the batch is signed, queue it in the decision process; the task gives its verdicts."""
        await self._maintain_index()
        documents, next_offsets = prepared.documents, prepared.next_offsets
        signing_started = time.perf_counter()
        signatures = await self._signers.signatures(prepared.signing)
        signing_seconds = time.perf_counter() - signing_started
        decision = self._decisions.submit(
            documents, source_offsets=self._index_offsets(next_offsets), signatures=signatures
        )
        return asyncio.create_task(self._recorded(decision, signing_seconds))

    async def _recorded(
        self, decision: asyncio.Task[tuple[Verdicts, BatchTimings]], signing_seconds: float
    ) -> Decision:
        verdicts, timings = await decision
        # Fingerprinting is the wait for the signing workers, or the signing in the thread without them.
        self._metrics.observe(Stage.FINGERPRINT, signing_seconds + timings.fingerprint)
        # The index stage covers the lookup and the batch's LMDB write transaction.
        self._metrics.observe(Stage.INDEX_LOOKUP, timings.lookup + timings.store)
        return Decision(verdicts, timings.leads, timings.closes)

    async def _publish(self, decided: Decided, consumer: BatchConsumer, producer: TransactionalProducer) -> None:
        """One Kafka transaction: the batch's records and its input offsets."""
        kafka = self._settings.kafka
        produce_started = time.perf_counter()
        async with asyncio.timeout(kafka.transaction_timeout_ms / 1000):
            try:
                record = decided.verdict_record
                outgoing = decided.outgoing if record is None else [*decided.outgoing, record]
                commit_seconds = await producer.publish(outgoing, decided.next_offsets, kafka.group_id)
            except BaseException:
                self._metrics.record_transaction("aborted")
                raise
        self._metrics.observe(Stage.PRODUCE, time.perf_counter() - produce_started - commit_seconds)
        self._metrics.record_transaction("committed", commit_seconds)
        self._account(decided)
        self._record_lag(consumer, decided.fetched)
        self._metrics.observe(Stage.BATCH, time.perf_counter() - decided.started)

    def _account(self, decided: Decided) -> None:
        records, outgoing, dead = decided.records, decided.outgoing, decided.dead
        stats = self._stats
        # Topics counted by C loops (map, Counter): a generator step a record costs more than the counting.
        consumed, published = Counter(map(_TOPIC, records)), Counter(map(_TOPIC, outgoing))
        stats.consumed += len(records)
        stats.published += published[self._settings.kafka.output_topic]
        stats.transactions += 1
        for doc, verdict in decided.dropped:
            stats.dropped[verdict.reason] += 1
            if len(stats.examples) < _EXAMPLES and verdict.match_id is not None:
                stats.examples.append((doc.id, verdict.match_id, verdict.distance or 0))
        dead_reasons = Counter(letter.reason for letter in dead)
        stats.dead_lettered.update(dead_reasons)
        if dead:
            self._dead_letters.add(dead)
        self._metrics.record_consumed(consumed)
        self._metrics.record_published(published)
        # The duplicates alone: iterating every verdict again would build a tuple per message for nothing.
        self._metrics.record_verdicts([verdict for _, verdict in decided.dropped])
        self._metrics.record_dead_lettered(dead_reasons)

    def _record_lag(self, consumer: BatchConsumer, records: Sequence[ConsumerRecord]) -> None:
        last: dict[tuple[str, int], ConsumerRecord] = {}
        for record in records:
            last[(record.topic, record.partition)] = record
        now = time.time()
        lags = {}
        for (topic, partition), record in last.items():
            stable = consumer.client.last_stable_offset(TopicPartition(topic, partition))
            behind = max(0, stable - record.offset - 1) if stable is not None and stable >= 0 else 0
            lags[(topic, partition)] = PartitionLag(behind, max(0.0, now - record.timestamp / 1000) if behind else 0.0)
        self._metrics.record_lag(lags)

    async def _maintain_index(self, *, force: bool = False) -> None:
        """Every few seconds: drop entries past max_age (event time) and refresh the index gauges.

        Expiry only reclaims space: the decision core already ignores entries older than max_age (each document
        by its own event time). It runs by the index's own clock (``CLOCK_WINDOW``), which records stamped far
        ahead do not move.
        """
        now = time.monotonic()
        if now - self._index_stats_at < _INDEX_STATS_INTERVAL_SECONDS and not force:
            return
        self._index_stats_at = now
        try:
            expired, usage = await self._decisions.maintain()
        except STORAGE_ERRORS as exc:
            if not force:
                raise
            log.warning("index maintenance failed too: %r", exc)  # the index is full: expiry has no room either
            return
        self._metrics.record_index(
            entries=usage["entries"],
            used_bytes=usage["disk_bytes"],
            map_size_bytes=usage["map_size"],
            capacity_bytes=index_capacity_bytes(
                self._decisions.path, usage["disk_bytes"], self._settings.index.max_map_size_bytes
            ),
            mirror_bytes=usage["mirror_bytes"],
            mirrored_tables=usage["mirrored_tables"],
            expired=expired,
        )


_Unpublished = deque[tuple[Prepared, asyncio.Task[asyncio.Future[Decision]]]]
"""Batches fetched and not yet published, in order, each with the task that queues its decision."""


def _first_offsets(origins: Iterable[Origin]) -> dict[tuple[str, int], int]:
    """The first offset of each partition among these (topic, partition, offset)."""
    first: dict[tuple[str, int], int] = {}
    for topic, partition, offset in origins:
        if offset < first.get((topic, partition), offset + 1):
            first[(topic, partition)] = offset
    return first
