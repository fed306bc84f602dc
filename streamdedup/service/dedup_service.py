"""The Kafka service: asyncio lifecycle around the decision core, exactly-once from input to output.

One batch: ``getmany`` -> decode -> sign (fingerprint and sketch, in the ``SignerPool`` worker processes) ->
``Deduplicator.decide`` in the ``DecisionProcess`` (one LMDB transaction: the kept fingerprints and the input
offsets after the batch) -> one Kafka transaction (novel records, duplicates, dead letters and the input
offsets) -> commit. This process keeps only the Kafka side, so aiokafka and the decision core each have a
core. LMDB commits first, so the index is never behind Kafka; when Kafka did not commit (crash, outage),
start-up and every new assignment roll the index back to the Kafka-committed offsets and the batch is
replayed with the same verdicts. Batch N+1 is decided while batch N's transaction commits and the
workers sign batch N+2 when it is already fetched: the three stages use both cores.

One instance must own every input partition (the index is local to it). A partial assignment means another
instance joined the group: the service says so loudly and processes nothing until it owns everything again.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import reduce

import numpy as np
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced
from aiokafka.structs import ConsumerRecord

from .decide import BatchTimings, Verdict, Verdicts
from .decision_process import DecisionProcess, DecisionProcessDied
from .fingerprint import fingerprint_hex
from .garbage import collecting_for_batches
from .document import DeadLetter, Document, DocumentDecoder
from .health import HealthServer
from .index import STORAGE_ERRORS
from .kafka.admin import admin_client, ensure_topics, wait_for_group_coordinator
from .kafka.clients import common_options
from .kafka.consumer import BatchConsumer, Unreadable
from .kafka.producer import TransactionalProducer
from .kafka.records import (
    OutgoingRecord,
    dead_letter,
    duplicate,
    largest_record_bytes,
    novel,
    record_bytes,
    topic_record_limits,
    truncated_dead_letter,
)
from .lifecycle import Lifecycle
from .metrics import PartitionLag, ServiceMetrics, Stage, index_capacity_bytes
from .names import (
    DEAD_LETTER_DECIDE_CRASH,
    DEAD_LETTER_DECIDE_ERROR,
    DEAD_LETTER_OUTPUT_TOO_LARGE,
    DEAD_LETTER_REASONS,
    DEAD_LETTER_SIGN_ERROR,
    DEAD_LETTER_UNREADABLE,
)
from .settings import Settings
from .signature import Signatures, SignerPool
from .workers import WorkerDied

__all__ = ["DedupService", "InstanceFenced", "ServiceStats", "run_service"]

log = logging.getLogger(__name__)

# Index size gauges read LMDB statistics; refreshing them every batch would cost more than it tells.
_INDEX_STATS_INTERVAL_SECONDS = 5.0
# Fetched batches not yet handed to their Kafka transaction: one waiting for its verdicts, the next ones signed
# and queued in the decision process as soon as they are signed, so neither the decision process nor the
# signing workers wait for this process's turn. A decision process that falls behind decides the batches queued
# there together, which costs it less a batch: room for several lets it catch up (4 gave groups of 2-3, 8 of 2-6).
_UNPUBLISHED_BATCHES = 8
# New signing workers after a death: at once after a pool that lived this long, else after a pause that doubles
# up to its maximum (a pool that keeps dying, or a host that refuses processes, is not hammered).
_SIGNERS_HEALTHY_SECONDS = 60.0
_SIGNERS_RETRY_SECONDS = 1.0
_SIGNERS_RETRY_MAX_SECONDS = 60.0
# Dead letters are logged as one line per this many seconds at most: counts by reason, an example of each.
_DEAD_LETTER_LOG_SECONDS = 10.0
# What a duplicate adds to its input record beside the fingerprint (match id, distance, reason, source): an
# input record this much under its topic's limit fits there. Larger match ids are cut with the dead letter.
_OUTPUT_HEADER_ALLOWANCE = 4096
# While consumption is paused (the index refuses batches, a decision process is replaced), the consumer is polled
# this often: one that does not poll for max.poll.interval.ms (5 minutes) leaves the group.
_PAUSED_POLL_SECONDS = 1.0
# The error of a document whose decision killed the decision process ("what: Class: message", as _failed reads).
_DECIDE_CRASH = "killed the decision process: DecisionProcessDied: it died deciding this document alone"


class _Interrupted(Exception):
    """A stop or a rebalance cut short the recovery of a batch: it is fetched again from the committed offsets."""


class InstanceFenced(RuntimeError):
    """A producer with this instance's transactional id started after it: another instance took over (or the
    broker aborted a transaction this one left open past ``transaction_timeout_ms``). The service stops."""


@dataclass(frozen=True)
class _Prepared:
    """A fetched batch, decoded, its texts handed to the signing workers (``signing`` None: sign in-thread)."""

    records: Sequence[ConsumerRecord]
    decoded: list[Document | DeadLetter]
    documents: list[Document]
    next_offsets: dict[TopicPartition, int]
    signing: Future[Signatures] | None
    started: float


@dataclass(frozen=True)
class _Decided:
    """A decided batch waiting for its Kafka transaction."""

    records: Sequence[ConsumerRecord]
    next_offsets: dict[TopicPartition, int]
    outgoing: list[OutgoingRecord]
    dropped: list[tuple[Document, Verdict]]
    dead: list[DeadLetter]
    started: float


@dataclass
class ServiceStats:
    """Running totals since start (the demo prints them; metrics carry the same counts)."""

    consumed: int = 0
    published: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    dead_lettered: Counter[str] = field(default_factory=Counter)
    transactions: int = 0
    examples: list[tuple[str, str, int]] = field(default_factory=list)
    """(duplicate id, id it duplicates, Hamming distance) of the first few duplicates."""


class DedupService(Lifecycle):
    """``start()`` opens the index and launches the consume loop; ``stop()`` finishes the batch and closes.

    ``wait()`` returns when the loop ends (after ``stop()``/``request_stop()``) and raises what ended it.
    """

    def __init__(self, settings: Settings, *, metrics: ServiceMetrics | None = None, max_examples: int = 5) -> None:
        self.settings = settings
        kafka = settings.kafka
        radius = settings.index.radius
        self.metrics = metrics or ServiceMetrics(
            radius=radius,
            width=settings.fingerprint.width,
            dead_letter_reasons=DEAD_LETTER_REASONS,
            input_topics=kafka.input_topics,
            output_topics=self._output_topics(),
        )
        self.stats = ServiceStats()
        self._max_examples = max_examples
        self._decoder = DocumentDecoder(settings.input)
        self._decisions = DecisionProcess(settings)
        self._signers: SignerPool | None = None
        self._signers_started = 0.0
        self._signers_pause = 0.0
        self._respawning: asyncio.Task[None] | None = None
        self._health: HealthServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._batch_lock = asyncio.Lock()
        self._needs_reconcile = False
        self._split = False
        self._assigned: frozenset[TopicPartition] = frozenset()
        self._reconciled: frozenset[TopicPartition] | None = None
        self._in_flight: asyncio.Task[None] | None = None
        self._producer_ready = False
        self._index_stats_at = 0.0
        # The largest record each output topic takes, read at the start of each session.
        self._record_limits: dict[str, int] = {}
        self._dead_letter_log = _DeadLetterLog(_DEAD_LETTER_LOG_SECONDS)
        # Why the index refuses batches (full map or disk), None while it stores them; the next pause after one.
        self._storage_error: str | None = None
        self._storage_pause = 0.0
        # The pause before the next decision process starts: none after one that decided something, then doubling.
        self._death_pause = 0.0
        # The batch the decision process died deciding, and how many times.
        self._dying: tuple[_Prepared, int] | None = None
        self._fetching_paused = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._task is not None:
            return
        await self._decisions.start()
        await self._start_signers()
        if self.settings.metrics.enabled:
            self._health = HealthServer(
                self.metrics.registry,
                self._readiness,
                host=self.settings.metrics.host,
                port=self.settings.metrics.port,
                liveness=self._liveness,
                reasons=self._readiness_reasons,
            )
            await self._health.start()
        self._task = asyncio.create_task(self._main(), name="streamdedup-service")

    def request_stop(self) -> None:
        """Ask the loop to finish the current batch, commit it and end (safe from a signal handler)."""
        self._stopping.set()

    async def wait(self) -> None:
        if self._task is None:
            raise RuntimeError("the service is not started")
        await asyncio.shield(self._task)

    async def stop(self) -> None:
        """Idempotent: finish the batch, commit, leave the group, close the index."""
        self.request_stop()
        task, self._task = self._task, None
        try:
            if task is not None:
                await task
        finally:
            if self._health is not None:
                await self._health.stop()
                self._health = None
            respawning, self._respawning = self._respawning, None
            if respawning is not None:
                respawning.cancel()
                await asyncio.gather(respawning, return_exceptions=True)
            await self._stop_signers()
            await self._decisions.stop()

    async def _start_signers(self) -> None:
        """Spawn the signing workers and wait until they can sign (a first batch would wait for that)."""
        if self.settings.dedup.workers:
            await self._warm_up(self._spawn_signers())

    def _spawn_signers(self) -> SignerPool:
        loop = asyncio.get_running_loop()
        self._signers = SignerPool(
            self.settings.fingerprint,
            self.settings.dedup,
            self.settings.dedup.workers,
            self._decisions.plan,
            # Every death of one of its workers, found the moment it happens (the stream may be idle), and only
            # there: a batch whose worker died is signed by the decision core and reports nothing.
            on_death=lambda pool: loop.call_soon_threadsafe(self._signers_died, pool),
        )
        self._signers_started = time.monotonic()
        return self._signers

    async def _warm_up(self, signers: SignerPool) -> None:
        await asyncio.gather(*map(asyncio.wrap_future, signers.warm_up()))
        log.info("%d signing workers ready", signers.workers, extra={"pids": signers.pids})

    async def _stop_signers(self) -> None:
        signers, self._signers = self._signers, None
        if signers is not None:
            await asyncio.to_thread(signers.stop)

    async def _signatures(self, prepared: _Prepared) -> Signatures | None:
        """The workers' signatures of a batch; None (the decision core signs it) without workers or when one
        died."""
        if prepared.signing is None:
            return None
        try:
            return await asyncio.wrap_future(prepared.signing)
        except WorkerDied:
            return None

    def _signers_died(self, signers: SignerPool) -> None:
        """A worker of ``signers`` died: the decision core signs the batches until new workers are ready. Once
        per broken pool (its other workers may die with it)."""
        if signers is not self._signers:
            return
        self._signers = None
        self.metrics.record_worker_death("signer")
        log.error("a signing worker died; the decision core signs the batches until new workers are ready")
        if time.monotonic() - self._signers_started > _SIGNERS_HEALTHY_SECONDS:
            self._signers_pause = 0.0
        self._respawn_signers(signers)

    def _respawn_signers(self, dead: SignerPool | None) -> None:
        """Start new signing workers in the background: at once after a pool that lived, else after a pause."""
        pause = self._signers_pause
        self._signers_pause = min(max(2 * pause, _SIGNERS_RETRY_SECONDS), _SIGNERS_RETRY_MAX_SECONDS)
        log.info("new signing workers start in %.0f s", pause)
        self._respawning = asyncio.create_task(self._new_signers(dead, pause), name="streamdedup-signers")

    async def _new_signers(self, dead: SignerPool | None, pause: float) -> None:
        if dead is not None:
            await asyncio.to_thread(dead.stop)  # its other workers finish the batches they hold
        await self._sleep_unless_stopping(pause)
        if self._stopping.is_set():
            return
        try:
            signers = self._spawn_signers()
        except Exception as exc:  # a host that refuses new processes
            log.error("new signing workers did not start (not spawned): %r", exc)
            self._respawn_signers(None)
            return
        try:
            await self._warm_up(signers)
        except Exception as exc:  # a worker that died starting: its on_death replaces the pool
            log.error("new signing workers did not start: %r", exc)

    @property
    def running(self) -> bool:
        """False once the consume loop has ended (stopped, or failed: ``wait()`` raises why)."""
        return self._task is not None and not self._task.done()

    @property
    def health_port(self) -> int | None:
        return self._health.port if self._health is not None else None

    def _readiness(self) -> Mapping[str, bool]:
        return {
            "partitions_assigned": bool(self._assigned) and not self._split,
            "index_open": self._decisions.open,
            "producer_ready": self._producer_ready,
            "index_storing": self._storage_error is None,
        }

    def _readiness_reasons(self) -> Mapping[str, str]:
        return {} if self._storage_error is None else {"index_storing": self._storage_error}

    def _liveness(self) -> Mapping[str, bool]:
        return {"consume_loop_running": self._task is not None and not self._task.done()}

    # ------------------------------------------------------------------ the loop

    async def _main(self) -> None:
        kafka = self.settings.kafka
        backoff = kafka.retry_backoff_seconds
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                await self._session()
            except ProducerFenced as exc:
                # A new producer would fence the instance that replaced this one, which would fence it back.
                log.error(
                    "FENCED: a newer producer with transactional id %r took over (another instance started with "
                    "it, or this one was frozen past transaction_timeout_ms); stopping, having published nothing "
                    "since its last committed batch",
                    kafka.producer_transactional_id,
                    extra={"consumed": self.stats.consumed, "published": self.stats.published},
                )
                raise InstanceFenced(f"fenced: transactional id {kafka.producer_transactional_id!r}") from exc
            except (KafkaError, OSError, TimeoutError) as exc:
                if time.monotonic() - started > kafka.retry_backoff_max_seconds:
                    backoff = kafka.retry_backoff_seconds  # the last session worked for a while
                log.warning("Kafka error (%r); recreating the clients in %.1f s", exc, backoff)
                await self._sleep_unless_stopping(backoff)
                backoff = min(backoff * 2, kafka.retry_backoff_max_seconds)
            except DecisionProcessDied as exc:
                # LMDB kept every batch the worker committed; the new session reconciles them with Kafka.
                await self._sleep_unless_stopping(self._decision_died(exc))
                await self._restart_decisions()
            except STORAGE_ERRORS as exc:
                # Outside a batch (reconciling, replaying): the new session starts over once the pause is over.
                await self._sleep_unless_stopping(self._storage_failed(exc))
        self._dead_letter_log.flush()
        log.info("stopped", extra={"consumed": self.stats.consumed, "published": self.stats.published})

    async def _session(self) -> None:
        """One life of the Kafka clients; a Kafka, network or timeout error ends it and the caller starts anew."""
        kafka = self.settings.kafka
        self._needs_reconcile = False
        self._reconciled = None
        self._split = False
        # The producer starts first: it fences an earlier incarnation and completes its open transaction,
        # so the committed offsets read during reconciliation are final.
        async with TransactionalProducer(kafka) as producer:
            await self._prepare_cluster()
            consumer = BatchConsumer(
                kafka,
                max_message_bytes=self.settings.input.max_message_bytes,
                on_assigned=self._on_assigned,
                on_revoked=self._on_revoked,
            )
            async with consumer:
                self._producer_ready = True
                try:
                    await self._consume(consumer, producer)
                finally:
                    self._producer_ready = False
                    self._assigned = frozenset()

    async def _consume(self, consumer: BatchConsumer, producer: TransactionalProducer) -> None:
        """Batches flow through the stages at once: batch N's Kafka transaction commits while the decision
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
            while unpublished or not self._stopping.is_set():
                if not unpublished:
                    records = await consumer.batch()
                    # aiokafka may hand out records of a new assignment before the rebalance listener ran:
                    # nothing is processed until the index is reconciled with exactly the current assignment.
                    # Records fetched before that are dropped here and fetched again from the committed offsets.
                    if self._rebalanced(consumer):
                        await self._settle()
                        # An instance frozen until the group gave its partitions away comes back through here:
                        # find out now whether it was replaced, not at a batch it may never get.
                        if consumer.subscribed_partitions():
                            await producer.check_not_fenced()
                        await self._reconcile(consumer)
                        continue
                    if self._split or not records:
                        await self._settle()  # nothing else to do: finish the open transaction now
                        self._dead_letter_log.flush_due()
                        if self._decisions.died:
                            # Found between polls, not at the next batch: an idle stream gets a new one too.
                            raise DecisionProcessDied("the decision process died while the input was idle")
                        continue
                    enqueue(records)
                    continue
                while (
                    len(unpublished) < _UNPUBLISHED_BATCHES
                    and not self._stopping.is_set()
                    and not self._rebalanced(consumer)
                    and (following := await consumer.batch(wait=False))
                ):
                    enqueue(following)
                prepared, submission = unpublished[0]
                try:
                    verdicts = await (await submission)
                except (*STORAGE_ERRORS, DecisionProcessDied) as exc:
                    await self._recover(consumer, unpublished, exc)
                    continue
                except _Interrupted:
                    await self._drained(unpublished)
                    unpublished.clear()
                    continue
                self._death_pause = 0.0  # the decision process decides: a next death replaces it at once
                if self._dying is not None or self._storage_error is not None or self._fetching_paused:
                    self._recovered(consumer)
                unpublished.popleft()
                async with self._batch_lock:
                    if self._rebalanced(consumer):
                        continue
                    decided = self._decided(prepared, verdicts)
                    await self._settle()
                    self._in_flight = asyncio.create_task(self._publish(decided, consumer, producer))
        finally:
            # Decided but not published: reconciliation undoes them. Their own failures are not this one's.
            submissions = await asyncio.gather(*(submission for _, submission in unpublished), return_exceptions=True)
            decisions = [decision for decision in submissions if isinstance(decision, asyncio.Task)]
            await asyncio.gather(*decisions, return_exceptions=True)
            await self._settle()

    async def _submitted_after(
        self, previous: asyncio.Task[asyncio.Future[Verdicts]] | None, prepared: _Prepared
    ) -> asyncio.Future[Verdicts]:
        """Queue ``prepared`` in the decision process once it is signed and ``previous`` (the batch fetched
        before it) is queued there: the index sees the batches in the order fetched. A batch behind one that
        failed to be queued fails with it."""
        if previous is not None:
            await previous
        return await self._submit_decision(prepared)

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
                pause = self._decision_died(error)
            else:
                pause = self._storage_failed(error)
                await self._maintain_index(force=True)  # the gauges the alerts read; expiry may make room
            if not await self._paused_for(consumer, pause):
                unpublished.clear()
                return
            try:
                if not self._decisions.open:
                    await self._restart_decisions()
                await self._decisions.rollback(
                    _first_offsets(
                        (record.topic, record.partition, record.offset)
                        for prepared, _ in unpublished
                        for record in prepared.records
                    )
                )
            except (*STORAGE_ERRORS, DecisionProcessDied) as exc:
                error = exc
                continue
            break
        batches = [prepared for prepared, _ in unpublished]
        unpublished.clear()
        previous: asyncio.Task[asyncio.Future[Verdicts]] | None = None
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
        if self._storage_error is not None:
            log.warning("the index stores batches again; consuming again")
            self._storage_error = None
            self._storage_pause = 0.0
            self.metrics.record_storage(failed=False)
        if self._fetching_paused:
            consumer.resume(consumer.assignment())
            self._fetching_paused = False

    def _storage_failed(self, error: Exception) -> float:
        """Record that the index refused a batch; the pause before the next attempt."""
        kafka = self.settings.kafka
        pause = self._storage_pause or kafka.retry_backoff_seconds
        self._storage_pause = min(2 * pause, kafka.retry_backoff_max_seconds)
        self._storage_error = f"{type(error).__name__}: {error}"
        self.metrics.record_storage(failed=True)
        log.error(
            "THE INDEX CANNOT STORE THE BATCH (%s): consumption paused, not ready; trying again in %.1f s "
            "(free space on the index's volume, or raise index.max_map_size_bytes and restart)",
            self._storage_error,
            pause,
        )
        return pause

    def _decision_died(self, error: Exception) -> float:
        """Record a death of the decision process; the pause before the next one starts."""
        kafka = self.settings.kafka
        pause = self._death_pause
        self._death_pause = min(max(2 * pause, kafka.retry_backoff_seconds), kafka.retry_backoff_max_seconds)
        self.metrics.record_worker_death("decision")
        log.error("%s; starting a new one in %.1f s", error, pause)
        return pause

    async def _restart_decisions(self) -> None:
        await self._decisions.stop()
        await self._decisions.start()

    async def _paused_for(self, consumer: BatchConsumer, seconds: float) -> bool:
        """Wait ``seconds`` fetching nothing: every assigned partition paused, the consumer polled now and then
        so that the group keeps this member. False when a stop or a rebalance cut the wait short."""
        consumer.pause(consumer.assignment())
        self._fetching_paused = True
        deadline = time.monotonic() + seconds
        while not (self._stopping.is_set() or self._rebalanced(consumer)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            await self._sleep_unless_stopping(min(remaining, _PAUSED_POLL_SECONDS))
            await consumer.batch(wait=False)
        return False

    @staticmethod
    async def _drained(unpublished: _Unpublished) -> None:
        """Wait until every unpublished batch's decision has ended, whatever its outcome."""
        submissions = await asyncio.gather(*(submission for _, submission in unpublished), return_exceptions=True)
        await asyncio.gather(*(s for s in submissions if isinstance(s, asyncio.Future)), return_exceptions=True)

    async def _decided_alone(self, prepared: _Prepared) -> asyncio.Future[Verdicts]:
        """The batch's decision, queued only once it is over: no later batch shares the process with it."""
        decision = await self._submit_decision(prepared)
        await asyncio.wait([decision])
        return decision

    @staticmethod
    async def _done(verdicts: Awaitable[Verdicts]) -> asyncio.Future[Verdicts]:
        future: asyncio.Future[Verdicts] = asyncio.get_running_loop().create_future()
        future.set_result(await verdicts)
        return future

    async def _decided_apart(self, prepared: _Prepared, wait: Callable[[float], Awaitable[bool]]) -> Verdicts:
        """The verdicts of a batch whose decision killed the decision process twice, decided in parts on fresh
        processes: a part that kills it is halved, down to the documents that kill it alone. Those get the crash
        as their error (dead-lettered as ``decide_crash``, not stored); the others get the verdicts they get in
        one batch, since the decision core's do not depend on batch boundaries. The batch's input offsets are
        stored once every part is decided. ``wait(pause)`` waits before each new process, False to give up."""
        documents = prepared.documents
        offsets = {(tp.topic, tp.partition): offset for tp, offset in prepared.next_offsets.items()}
        signatures = await self._signatures(prepared)
        width = self.settings.fingerprint.width
        parts: list[Verdicts] = []
        count = len(documents)
        todo = [(count // 2, count), (0, count // 2)] if count > 1 else []
        if count == 1:
            log.error("document %r kills the decision process; dead-lettering it", documents[0].id)
            parts.append(_crashed(width))
        while todo:
            low, high = todo.pop()
            part = None if signatures is None else signatures.subset(slice(low, high))
            try:
                verdicts, _ = await self._decisions.submit(documents[low:high], source_offsets={}, signatures=part)
            except DecisionProcessDied as exc:
                if not await wait(self._decision_died(exc)):
                    raise _Interrupted from exc
                await self._restart_decisions()
                await self._decisions.rollback(_first_offsets(doc.origin for doc in documents[low:high]))
                if high - low == 1:
                    log.error("document %r kills the decision process; dead-lettering it", documents[low].id)
                    parts.append(_crashed(width))
                else:
                    middle = (low + high) // 2
                    todo += [(middle, high), (low, middle)]
                continue
            self._death_pause = 0.0
            parts.append(verdicts)
        # Nothing left that can kill it: the offsets of a batch without documents.
        empty, _ = await self._decisions.submit([], source_offsets=offsets, signatures=None)
        return reduce(Verdicts.joined, parts, empty)

    def _rebalanced(self, consumer: BatchConsumer) -> bool:
        """Whether the assignment changed since the index was last reconciled with Kafka."""
        return self._needs_reconcile or consumer.assignment() != self._reconciled

    async def _settle(self) -> None:
        """Wait for the transaction in flight; its failure ends the session (the caller recreates clients)."""
        task, self._in_flight = self._in_flight, None
        if task is not None:
            await task

    async def _on_revoked(self, revoked: frozenset[TopicPartition]) -> None:
        # Waits for the batch in flight: its transaction ends before the partitions move. A failure is left
        # in the task for the consume loop to raise.
        async with self._batch_lock:
            if self._in_flight is not None:
                await asyncio.wait([self._in_flight])
            self._assigned = frozenset()

    async def _on_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        async with self._batch_lock:
            self._assigned = assigned
            self._needs_reconcile = True

    async def _reconcile(self, consumer: BatchConsumer) -> None:
        """Check that this instance owns every input partition; roll the index back to Kafka's offsets."""
        assigned = consumer.assignment()
        everything = consumer.subscribed_partitions()
        self.metrics.record_assignment([(tp.topic, tp.partition) for tp in assigned])
        missing = everything - assigned
        if missing or not everything:
            if missing:
                log.error(
                    "ANOTHER INSTANCE IS IN CONSUMER GROUP %r: this one was assigned %d of %d input partitions "
                    "(missing %s). The index is local to one instance, so splitting the input would let "
                    "duplicates through; processing NOTHING until this instance owns every partition again. "
                    "Stop the other instance (scale-out is not supported yet).",
                    self.settings.kafka.group_id,
                    len(assigned),
                    len(everything),
                    ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(missing)),
                )
            else:
                log.warning("input topics %s have no partitions (yet)", self.settings.kafka.input_topics)
            consumer.pause(assigned)
            self._split = True
            self._needs_reconcile = False
            self._reconciled = assigned
            return
        consumer.resume(assigned)
        self._split = False
        stored = await self._decisions.source_offsets()
        committed = await self._committed(consumer, assigned, stored)
        # LMDB commits before Kafka, so the index is at or ahead of Kafka; behind means it lost data.
        behind = {
            tp: stored.get((tp.topic, tp.partition), 0)
            for tp, offset in committed.items()
            if stored.get((tp.topic, tp.partition), 0) < offset
        }
        if behind:
            self._needs_reconcile = False  # a rebalance during the replay sets it again, and interrupts it
            if not await self._replay(consumer, behind, committed):
                return  # the next reconciliation goes on from where the index got to
        removed = await self._decisions.rollback({(tp.topic, tp.partition): offset for tp, offset in committed.items()})
        consumer.seek(committed)
        self._needs_reconcile = False
        self._reconciled = assigned
        log.info(
            "owning all %d input partitions; index reconciled with Kafka (%d entries rolled back)",
            len(assigned),
            removed,
            extra={"committed": {f"{tp.topic}[{tp.partition}]": o for tp, o in sorted(committed.items())}},
        )

    async def _committed(
        self, consumer: BatchConsumer, assigned: frozenset[TopicPartition], stored: Mapping[tuple[str, int], int]
    ) -> dict[TopicPartition, int]:
        """Where each partition resumes: Kafka's committed offset; without one (a new group id, a group deleted
        or its offsets expired) the index's own offset, so that nothing it holds is rolled back and published
        again; the earliest offset for a partition neither knows."""
        committed = await consumer.committed(assigned)
        lost = sorted(tp for tp, offset in committed.items() if offset is None)
        known = {tp: stored[(tp.topic, tp.partition)] for tp in lost if (tp.topic, tp.partition) in stored}
        if known:
            log.warning(
                "Kafka has no committed offset of group %r for %s; resuming where the index is",
                self.settings.kafka.group_id,
                ", ".join(f"{tp.topic}[{tp.partition}] at {offset}" for tp, offset in sorted(known.items())),
            )
        unknown = [tp for tp in lost if tp not in known]
        earliest = await consumer.beginning_offsets(unknown) if unknown else {}
        return {tp: offset if offset is not None else known.get(tp, earliest.get(tp, 0)) for tp, offset in committed.items()}

    async def _replay(
        self, consumer: BatchConsumer, behind: Mapping[TopicPartition, int], committed: Mapping[TopicPartition, int]
    ) -> bool:
        """Decide again, without publishing, what Kafka says was processed but the index lacks (it was lost,
        replaced by an older copy, or is new), so that duplicates of those documents are still caught. Each
        replayed batch advances the index's source offsets in its own transaction, like any batch. False
        when a rebalance or a stop interrupted it."""
        assigned = consumer.assignment()
        log.warning(
            "the index is behind Kafka's committed offsets for %s (was it replaced or lost?); replaying those "
            "records into the index, publishing nothing",
            ", ".join(f"{tp.topic}[{tp.partition}]: {behind[tp]} < {committed[tp]}" for tp in sorted(behind)),
        )
        ends = {tp: committed[tp] for tp in behind}
        consumer.pause(assigned - ends.keys())
        consumer.seek(behind)
        replayed = 0
        try:
            while ends:
                if self._stopping.is_set() or self._needs_reconcile or consumer.assignment() != assigned:
                    return False
                records = [
                    record
                    for record in await consumer.batch()
                    if record.offset < ends.get(TopicPartition(record.topic, record.partition), -1)
                ]
                if records:
                    await self._verdicts(self._prepare(records))
                    replayed += len(records)
                for tp in list(ends):
                    # The position, not the last record: transaction markers take offsets too.
                    if await consumer.position(tp) >= ends[tp]:
                        consumer.pause([tp])
                        del ends[tp]
        finally:
            consumer.resume(assigned)
        log.info("replayed %d records into the index", replayed)
        return True

    # ------------------------------------------------------------------ one batch

    def _prepare(self, records: Sequence[ConsumerRecord]) -> _Prepared:
        """Decode a fetched batch and hand its texts to the signing workers; nothing is decided yet."""
        started = time.perf_counter()
        origins = [(record.topic, record.partition, record.offset) for record in records]
        clamped = self._decoder.clamped_times
        decoded = self._decoder.decode_many(
            [record.value for record in records],
            default_ids=[f"{topic}-{partition}-{offset}" for topic, partition, offset in origins],
            timestamps=[record.timestamp / 1000.0 for record in records],
            origins=origins,
        )
        self.metrics.record_clamped_times(self._decoder.clamped_times - clamped)
        if self._record_limits and largest_record_bytes(records) > self._smallest_output_limit():
            decoded = self._too_large_for_output(records, decoded)
        documents = [item for item in decoded if type(item) is Document]
        # Plain tuples per record (a TopicPartition is several times dearer to build), one per partition after.
        last_offsets = {(record.topic, record.partition): record.offset for record in records}
        next_offsets = {TopicPartition(*partition): offset + 1 for partition, offset in last_offsets.items()}
        signers = self._signers
        signing = None if signers is None else signers.submit([doc.text for doc in documents])
        return _Prepared(records, decoded, documents, next_offsets, signing, started)

    def _smallest_output_limit(self) -> int:
        """The largest input record (:func:`record_bytes`) whose novel or duplicate record fits every topic
        it may go to."""
        kafka = self.settings.kafka
        topics = [kafka.output_topic] if kafka.duplicates_topic is None else [kafka.output_topic, kafka.duplicates_topic]
        room = self.settings.fingerprint.width // 4 + _OUTPUT_HEADER_ALLOWANCE
        return min(self._record_limits[topic] for topic in topics) - room

    def _too_large_for_output(
        self, records: Sequence[ConsumerRecord], decoded: list[Document | DeadLetter]
    ) -> list[Document | DeadLetter]:
        """``decoded`` with the documents whose output would not fit its topic dead-lettered, before the index
        could keep them."""
        limit = self._smallest_output_limit()
        result = list(decoded)
        for row, (record, item) in enumerate(zip(records, decoded, strict=True)):
            if type(item) is Document and (size := largest_record_bytes([record])) > limit:
                result[row] = DeadLetter(
                    DEAD_LETTER_OUTPUT_TOO_LARGE,
                    f"the record takes {size} bytes; its output would not fit the output topics "
                    f"(records up to about {limit} bytes fit)",
                    f"{record.topic}-{record.partition}-{record.offset}",
                )
        return result

    def _decided(self, prepared: _Prepared, verdicts: Verdicts) -> _Decided:
        """What to publish for a decided batch; nothing goes to Kafka here."""
        records = prepared.records
        outgoing, dropped, dead = self._outgoing(records, prepared.decoded, prepared.documents, verdicts)
        if self._record_limits and largest_record_bytes(outgoing) > min(self._record_limits.values()):
            outgoing = self._fitted(records, outgoing, dropped, dead)
        return _Decided(records, prepared.next_offsets, outgoing, dropped, dead, prepared.started)

    def _fitted(
        self,
        records: Sequence[ConsumerRecord],
        outgoing: list[OutgoingRecord],
        dropped: list[tuple[Document, Verdict]],
        dead: list[DeadLetter],
    ) -> list[OutgoingRecord]:
        """``outgoing`` with every record larger than its topic takes replaced by its dead letter, cut to fit
        the dead-letter topic (one published whole would be refused by the broker, and retried for ever)."""
        kafka = self.settings.kafka
        limits = self._record_limits
        # The records that have an outgoing record, in order: all but duplicates without a duplicates topic.
        skipped = set() if kafka.duplicates_topic is not None else {doc.origin for doc, _ in dropped}
        sources = [record for record in records if (record.topic, record.partition, record.offset) not in skipped]
        letters = {letter.id: letter for letter in dead}
        fitted = []
        for out, record in zip(outgoing, sources, strict=True):
            size = record_bytes(out)
            if size <= limits.get(out.topic, size):
                fitted.append(out)
                continue
            default_id = f"{record.topic}-{record.partition}-{record.offset}"
            letter = letters.get(default_id) if out.topic == kafka.dead_letter_topic else None
            if letter is None:
                letter = DeadLetter(
                    DEAD_LETTER_OUTPUT_TOO_LARGE,
                    f"its record for {out.topic} takes {size} bytes, over the {limits[out.topic]} that topic takes",
                    default_id,
                )
                dead.append(letter)
            fitted.append(truncated_dead_letter(record, kafka.dead_letter_topic, letter, limits[kafka.dead_letter_topic]))
        return fitted

    async def _verdicts(self, prepared: _Prepared) -> Verdicts:
        """The batch's verdicts, its kept documents and input offsets stored in one LMDB transaction."""
        return await (await self._submit_decision(prepared))

    async def _submit_decision(self, prepared: _Prepared) -> asyncio.Task[Verdicts]:
        """Once the batch is signed, queue it in the decision process; the task gives its verdicts."""
        await self._maintain_index()
        documents, next_offsets = prepared.documents, prepared.next_offsets
        signing_started = time.perf_counter()
        signatures = await self._signatures(prepared)
        signing_seconds = time.perf_counter() - signing_started
        decision = self._decisions.submit(
            documents,
            source_offsets={(tp.topic, tp.partition): offset for tp, offset in next_offsets.items()},
            signatures=signatures,
        )
        return asyncio.create_task(self._recorded(decision, signing_seconds))

    async def _recorded(
        self, decision: asyncio.Task[tuple[Verdicts, BatchTimings]], signing_seconds: float
    ) -> Verdicts:
        verdicts, timings = await decision
        # Fingerprinting is the wait for the signing workers, or the signing in the thread without them.
        self.metrics.observe(Stage.FINGERPRINT, signing_seconds + timings.fingerprint)
        # The index stage covers the lookup and the batch's LMDB write transaction.
        self.metrics.observe(Stage.INDEX_LOOKUP, timings.lookup + timings.store)
        return verdicts

    async def _publish(self, decided: _Decided, consumer: BatchConsumer, producer: TransactionalProducer) -> None:
        """One Kafka transaction: the batch's records and its input offsets."""
        kafka = self.settings.kafka
        produce_started = time.perf_counter()
        async with asyncio.timeout(kafka.transaction_timeout_ms / 1000):
            try:
                commit_seconds = await producer.publish(decided.outgoing, decided.next_offsets, kafka.group_id)
            except BaseException:
                self.metrics.record_transaction("aborted")
                raise
        self.metrics.observe(Stage.PRODUCE, time.perf_counter() - produce_started - commit_seconds)
        self.metrics.record_transaction("committed", commit_seconds)
        self._account(decided)
        self._record_lag(consumer, decided.records)
        self.metrics.observe(Stage.BATCH, time.perf_counter() - decided.started)

    def _outgoing(
        self,
        records: Sequence[ConsumerRecord],
        decoded: Sequence[Document | DeadLetter],
        documents: Sequence[Document],
        verdicts: Verdicts,
    ) -> tuple[list[OutgoingRecord], list[tuple[Document, Verdict]], list[DeadLetter]]:
        """Records to publish in input order: novel -> output, duplicate -> duplicates topic, bad -> DLQ."""
        kafka = self.settings.kafka
        hexes = fingerprint_hex(verdicts.fingerprints) if len(verdicts) else []
        # The documents are the decoded records that are not dead letters, in order: row counts them. Only
        # a duplicate's verdict is built as a tuple, from the columns.
        novel_rows = verdicts.novel.tolist()
        # Documents that could not be signed or decided: their rows' errors (rare: checked once a batch).
        errors = verdicts.errors if any(verdicts.errors) else None
        outgoing: list[OutgoingRecord] = []
        dropped: list[tuple[Document, Verdict]] = []
        dead: list[DeadLetter] = []
        row = -1
        for record, item in zip(records, decoded, strict=True):
            if type(item) is not Document:
                if type(record) is Unreadable:
                    item = DeadLetter.raised(
                        DEAD_LETTER_UNREADABLE,
                        f"the Kafka client cannot parse the record at {record.topic}[{record.partition}] offset "
                        f"{record.offset}; it was skipped",
                        record.error,
                        item.id,
                    )
                dead.append(item)
                outgoing.append(dead_letter(record, kafka.dead_letter_topic, item))
                continue
            row += 1
            if errors is not None and errors[row] is not None:
                letter = _failed(errors[row], item.id, f"{record.topic}-{record.partition}-{record.offset}")
                dead.append(letter)
                outgoing.append(dead_letter(record, kafka.dead_letter_topic, letter))
                continue
            if novel_rows[row]:
                outgoing.append(novel(record, kafka.output_topic, hexes[row]))
                continue
            verdict = verdicts[row]
            dropped.append((documents[row], verdict))
            if kafka.duplicates_topic is not None:
                outgoing.append(
                    duplicate(
                        record,
                        kafka.duplicates_topic,
                        hexes[row],
                        verdict.reason,
                        verdict.match_id or "",
                        verdict.distance if verdict.distance is not None else -1,
                        jaccard=verdict.jaccard,
                        threshold=self.settings.dedup.min_jaccard if self.settings.dedup.verify else None,
                    )
                )
        return outgoing, dropped, dead

    def _account(self, decided: _Decided) -> None:
        records, outgoing, dead = decided.records, decided.outgoing, decided.dead
        stats = self.stats
        stats.consumed += len(records)
        stats.published += sum(1 for record in outgoing if record.topic == self.settings.kafka.output_topic)
        stats.transactions += 1
        for doc, verdict in decided.dropped:
            stats.dropped[verdict.reason] += 1
            if len(stats.examples) < self._max_examples and verdict.match_id is not None:
                stats.examples.append((doc.id, verdict.match_id, verdict.distance or 0))
        dead_reasons = Counter(letter.reason for letter in dead)
        stats.dead_lettered.update(dead_reasons)
        if dead:
            self._dead_letter_log.add(dead)
        self.metrics.record_consumed(Counter(record.topic for record in records))
        self.metrics.record_published(Counter(record.topic for record in outgoing))
        # The duplicates alone: iterating every verdict again would build a tuple per message for nothing.
        self.metrics.record_verdicts([verdict for _, verdict in decided.dropped])
        self.metrics.record_dead_lettered(dead_reasons)

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
        self.metrics.record_lag(lags)

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
        self.metrics.record_index(
            entries=usage["entries"],
            used_bytes=usage["disk_bytes"],
            map_size_bytes=usage["map_size"],
            capacity_bytes=index_capacity_bytes(
                self._decisions.path, usage["disk_bytes"], self.settings.index.max_map_size_bytes
            ),
            mirror_bytes=usage["mirror_bytes"],
            mirrored_tables=usage["mirrored_tables"],
            expired=expired,
        )

    # ------------------------------------------------------------------ helpers

    def _output_topics(self) -> list[str]:
        kafka = self.settings.kafka
        topics = [kafka.output_topic, kafka.dead_letter_topic]
        if kafka.duplicates_topic is not None:
            topics.append(kafka.duplicates_topic)
        return topics

    async def _prepare_cluster(self) -> None:
        """Create the output topics (if configured to) and wait until the cluster can coordinate the group."""
        kafka = self.settings.kafka
        async with admin_client(**common_options(kafka)) as admin:
            if kafka.create_topics:
                await ensure_topics(
                    admin,
                    {topic: kafka.topic_partitions for topic in self._output_topics()},
                    replication_factor=kafka.topic_replication_factor,
                )
            self._record_limits = await topic_record_limits(admin, self._output_topics(), kafka.max_request_bytes)
            await wait_for_group_coordinator(admin, kafka.group_id, timeout=kafka.request_timeout_ms / 1000)

    async def _sleep_unless_stopping(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            pass


_Unpublished = deque[tuple[_Prepared, asyncio.Task[asyncio.Future[Verdicts]]]]
"""Batches fetched and not yet published, in order, each with the task that queues its decision."""


def _first_offsets(origins: Iterable[tuple[str, int, int]]) -> dict[tuple[str, int], int]:
    """The first offset of each partition among these (topic, partition, offset)."""
    first: dict[tuple[str, int], int] = {}
    for topic, partition, offset in origins:
        if offset < first.get((topic, partition), offset + 1):
            first[(topic, partition)] = offset
    return first


def _crashed(width: int) -> Verdicts:
    """The verdict of a document whose decision kills the decision process: not stored, dead-lettered."""
    fingerprint = np.zeros((1, width // 64), dtype=np.uint64)
    return Verdicts(np.ones(1, dtype=bool), ["unindexable"], fingerprint, [None], [None], [None], (_DECIDE_CRASH,))


def _failed(error: str, doc_id: str, default_id: str) -> DeadLetter:
    """The dead letter of a document whose verdict carries ``error``: the decision core's "not decided: Class:
    message", the signer's "could not ... this text: Class: message", or a crash of the decision process."""
    if error == _DECIDE_CRASH:
        reason = DEAD_LETTER_DECIDE_CRASH
    else:
        reason = DEAD_LETTER_DECIDE_ERROR if error.startswith("not decided:") else DEAD_LETTER_SIGN_ERROR
    parts = error.split(": ", 2)
    name = parts[1] if len(parts) == 3 and parts[1].isidentifier() else None
    return DeadLetter(reason, f"document {doc_id!r}: {error}", default_id, name)


class _DeadLetterLog:
    """Dead letters logged as one warning per ``interval`` seconds at most: the count of each reason and the
    first letter of each, where a poisoned stream would otherwise write a line per record."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._counts: Counter[str] = Counter()
        self._examples: dict[str, DeadLetter] = {}
        self._since = time.monotonic()

    def add(self, letters: Sequence[DeadLetter]) -> None:
        for letter in letters:
            self._counts[letter.reason] += 1
            self._examples.setdefault(letter.reason, letter)
        self.flush_due()

    def flush_due(self) -> None:
        if self._counts and time.monotonic() - self._since >= self._interval:
            self.flush()

    def flush(self) -> None:
        now = time.monotonic()
        if self._counts:
            log.warning(
                "dead-lettered %d records in the last %.0f s: %s",
                self._counts.total(),
                now - self._since,
                "; ".join(
                    f"{count} {reason} (first: {self._examples[reason].id}: {self._examples[reason].detail[:200]})"
                    for reason, count in sorted(self._counts.items())
                ),
                extra={"dead_lettered": dict(self._counts)},
            )
        self._counts.clear()
        self._examples.clear()
        self._since = now


async def run_service(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then finish the batch, commit and close (the ``streamdedup run`` command)."""
    service = DedupService(settings)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, service.request_stop)
    try:
        with collecting_for_batches():
            async with service:
                log.info(
                    "deduplicating %s -> %s",
                    ", ".join(settings.kafka.input_topics),
                    settings.kafka.output_topic,
                    extra={"bootstrap_servers": settings.kafka.bootstrap_servers, "group_id": settings.kafka.group_id},
                )
                await service.wait()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
