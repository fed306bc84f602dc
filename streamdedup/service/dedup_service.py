"""The Kafka service: asyncio lifecycle around the decision core, exactly-once from input to output.

``DedupService`` starts the decision process, the signing workers and the probes, then runs Kafka sessions (one
life of the producer and consumer each) until a stop: each session reconciles the index with Kafka
(:mod:`.reconciler`) whenever the assignment changes and runs the batch pipeline (:mod:`.batch_pipeline`) in
between. This process keeps only the Kafka side, so aiokafka and the decision core each have a core.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Mapping

from aiokafka.errors import KafkaError, ProducerFenced

from ..decision_process import DecisionProcess, DecisionProcessDied
from ..garbage import collecting_for_batches
from ..health import HealthServer
from ..index import STORAGE_ERRORS
from ..kafka.admin import admin_client, ensure_topics, wait_for_group_coordinator
from ..kafka.clients import common_options
from ..kafka.consumer import BatchConsumer
from ..kafka.decider_assignor import DeciderAssignor, DeciderClaim
from ..kafka.producer import TransactionalProducer
from ..kafka.records import topic_record_limits
from ..lifecycle import Lifecycle, StopRequest
from ..metrics import ServiceMetrics
from ..names import DEAD_LETTER_REASONS
from ..settings import Settings
from .backoff import Backoff
from .batch_pipeline import BatchPipeline
from .partition_ownership import PartitionOwnership
from .reconciler import Reconciler
from .sequencer import Sequencer, prepare_sequence_topic
from .signer_supervisor import SignerSupervisor
from .standby import Standby
from .stats import DeadLetterLog, ServiceStats

__all__ = ["DedupService", "InstanceFenced", "run_service"]

log = logging.getLogger(__name__)

# Dead letters are logged as one line per this many seconds at most: counts by reason, an example of each.
_DEAD_LETTER_LOG_SECONDS = 10.0


class InstanceFenced(RuntimeError):
    """A producer with this instance's transactional id started after it: another instance took over (or the
    broker aborted a transaction this one left open past ``transaction_timeout_ms``). The service stops."""


class DedupService(Lifecycle):
    """``start()`` opens the index and launches the consume loop; ``stop()`` finishes the batch and closes.

    ``wait()`` returns when the loop ends (after ``stop()``/``request_stop()``) and raises what ended it.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        kafka = settings.kafka
        # Scaled out, this instance sequences its share of the input and decides the sequence topic when Kafka
        # gives it that topic's partition; everything after the sequencer sees the sequence topic as its input.
        deciding = settings if kafka.sequence_topic is None else settings.decider()
        self._kafka = deciding.kafka
        # What this instance tells the decider group when it joins (scaled out).
        self._claim = DeciderClaim()
        self.metrics = ServiceMetrics(
            radius=settings.index.radius,
            width=settings.fingerprint.width,
            dead_letter_reasons=DEAD_LETTER_REASONS,
            input_topics=kafka.input_topics,
            output_topics=self._output_topics(),
        )
        self.stats = ServiceStats()
        self._decisions = DecisionProcess(settings)
        self._stop = StopRequest()
        self._ownership = PartitionOwnership()
        self._dead_letters = DeadLetterLog(_DEAD_LETTER_LOG_SECONDS)
        sequenced = kafka.sequence_topic is not None
        self._signers = SignerSupervisor(settings, self._decisions, self.metrics, self._stop, keyed=not sequenced)
        self._sequencer = Sequencer(settings, self.metrics, self._signers) if sequenced else None
        self._pipeline = BatchPipeline(
            deciding,
            metrics=self.metrics,
            stats=self.stats,
            decisions=self._decisions,
            signers=self._signers,
            ownership=self._ownership,
            dead_letters=self._dead_letters,
            stop=self._stop,
        )
        self._reconciler = Reconciler(
            deciding,
            metrics=self.metrics,
            decisions=self._decisions,
            pipeline=self._pipeline,
            ownership=self._ownership,
            stop=self._stop,
        )
        self._standby = (
            None
            if not sequenced
            else Standby(
                deciding,
                metrics=self.metrics,
                decisions=self._decisions,
                pipeline=self._pipeline,
                claim=self._claim,
                stop=self._stop,
            )
        )
        self._health: HealthServer | None = None
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._task is not None:
            return
        await self._decisions.start()
        await self._signers.start()
        if self._sequencer is not None:
            await self._sequencer.start()
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
        self._stop.set()

    async def wait(self) -> None:
        if self._task is None:
            raise RuntimeError("the service is not started")
        if self._sequencer is None:
            await asyncio.shield(self._task)
            return
        # Scaled out, the instance also ends when its sequencer does (a bug in it: nothing else stops it).
        roles = [self._task, asyncio.ensure_future(self._sequencer.wait())]
        done, _ = await asyncio.wait(roles, return_when=asyncio.FIRST_COMPLETED)
        for role in done:
            role.result()
        if roles[1] not in done:
            roles[1].cancel()

    async def stop(self) -> None:
        """Idempotent: finish the batch, commit, leave the group, close the index."""
        self.request_stop()
        task, self._task = self._task, None
        try:
            if task is not None:
                await task
        finally:
            if self._sequencer is not None:
                await self._sequencer.stop()
            if self._health is not None:
                await self._health.stop()
                self._health = None
            await self._signers.stop()
            await self._decisions.stop()

    @property
    def running(self) -> bool:
        """False once the consume loop has ended (stopped, or failed: ``wait()`` raises why)."""
        return self._task is not None and not self._task.done()

    @property
    def health_port(self) -> int | None:
        return self._health.port if self._health is not None else None

    def _readiness(self) -> Mapping[str, bool]:
        index = {"index_open": self._decisions.open, "index_storing": self._pipeline.storage_error is None}
        if self._sequencer is not None:
            # Standing by for the sequence topic is ready too: the instance sequences, and follows the decider.
            return {"sequencer_running": self._sequencer.running, **index}
        return {
            "partitions_assigned": self._ownership.partitions_assigned,
            "producer_ready": self._ownership.connected,
            **index,
        }

    def _readiness_reasons(self) -> Mapping[str, str]:
        error = self._pipeline.storage_error
        return {} if error is None else {"index_storing": error}

    def _liveness(self) -> Mapping[str, bool]:
        running = {"consume_loop_running": self._task is not None and not self._task.done()}
        if self._sequencer is not None:
            running["sequencer_running"] = self._sequencer.running
        return running

    # ------------------------------------------------------------------ the loop

    async def _main(self) -> None:
        kafka = self._kafka
        backoff = Backoff(kafka.retry_backoff_seconds, kafka.retry_backoff_max_seconds)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                await self._session()
            except ProducerFenced as exc:
                if self._sequencer is not None:
                    # Another instance took the sequence topic over (this one was frozen, or cut off): it decides
                    # now, and this one stands by again.
                    log.warning("fenced: another instance decides the sequence topic now; standing by")
                    continue
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
                    backoff.reset()  # the last session worked for a while
                pause = backoff.pause()
                log.warning("Kafka error (%r); recreating the clients in %.1f s", exc, pause)
                await self._stop.sleep(pause)
            except DecisionProcessDied as exc:
                # LMDB kept every batch the worker committed; the new session reconciles them with Kafka.
                await self._stop.sleep(self._pipeline.decision_died(exc))
                await self._pipeline.restart_decisions()
            except STORAGE_ERRORS as exc:
                # Outside a batch (reconciling, replaying): the new session starts over once the pause is over.
                await self._stop.sleep(self._pipeline.storage_failed(exc))
        self._dead_letters.flush()
        log.info("stopped", extra={"consumed": self.stats.consumed, "published": self.stats.published})

    async def _session(self) -> None:
        """One life of the Kafka clients; a Kafka, network or timeout error ends it and the caller starts anew."""
        if self._standby is not None:
            await self._decider_session(self._standby)
            return
        kafka = self._kafka
        # The producer starts first: it fences an earlier incarnation and completes its open transaction,
        # so the committed offsets read during reconciliation are final.
        async with TransactionalProducer(kafka) as producer:
            self._pipeline.output.limits = await self._prepare_cluster()
            consumer = self._consumer()
            # Connected before the consumer starts and until it has stopped: its listener may run in both.
            self._ownership.connect()
            try:
                async with consumer:
                    while await self._pipeline.run(consumer, producer):
                        # An instance frozen until the group gave its partitions away comes back through here:
                        # find out now whether it was replaced, not at a batch it may never get.
                        if consumer.subscribed_partitions():
                            await producer.check_not_fenced()
                        await self._reconciler.reconcile(consumer, producer)
            finally:
                self._ownership.disconnect()

    async def _decider_session(self, standby: Standby) -> None:
        """One life of the deciding role's clients in a scaled-out deployment. Its consumer is in the decider group
        of every instance; the one that Kafka gives the sequence partition starts the deployment's decider
        producer, which fences the instance that decided before (however long that one was frozen), and
        decides until the partition moves. The others stand by."""
        kafka = self._kafka
        self._pipeline.output.limits = await self._prepare_cluster()
        await standby.claim_progress()
        consumer = self._consumer()
        self._ownership.connect()
        try:
            async with consumer:
                while await standby.until_assigned(consumer):
                    self._claim.deciding = True
                    self.metrics.record_roles(deciding=True)
                    try:
                        async with TransactionalProducer(kafka) as producer:
                            log.info("deciding the sequence topic %s", kafka.sequence_topic)
                            while await self._pipeline.run(consumer, producer):
                                if not consumer.assignment():
                                    break  # the sequence partition moved: stand by again
                                await producer.check_not_fenced()
                                await self._reconciler.reconcile(consumer, producer)
                    finally:
                        self._claim.deciding = False
                        self.metrics.record_roles(deciding=False)
        finally:
            self._ownership.disconnect()

    # ------------------------------------------------------------------ helpers

    def _consumer(self) -> BatchConsumer:
        """The consumer of the input (or of the sequence topic), with the reconciler as its rebalance listener."""
        return BatchConsumer(
            self._kafka,
            max_message_bytes=self.settings.input.max_message_bytes,
            on_assigned=self._reconciler.on_assigned,
            on_revoked=self._reconciler.on_revoked,
            assignors=None if self._standby is None else (DeciderAssignor(self._claim),),
        )

    def _output_topics(self) -> list[str]:
        kafka = self.settings.kafka
        topics = [kafka.output_topic, kafka.dead_letter_topic]
        if kafka.duplicates_topic is not None:
            topics.append(kafka.duplicates_topic)
        return topics

    async def _prepare_cluster(self) -> dict[str, int]:
        """Create the output topics (if configured to) and wait until the cluster can coordinate the group; the
        largest record each output topic takes."""
        kafka = self._kafka
        async with admin_client(**common_options(kafka)) as admin:
            if kafka.create_topics:
                await ensure_topics(
                    admin,
                    {topic: kafka.topic_partitions for topic in self._output_topics()},
                    replication_factor=kafka.topic_replication_factor,
                )
            if kafka.sequence_topic is not None:
                await prepare_sequence_topic(admin, self.settings)
            limits = await topic_record_limits(admin, self._output_topics(), kafka.max_request_bytes)
            await wait_for_group_coordinator(admin, kafka.group_id, timeout=kafka.request_timeout_ms / 1000)
        return limits


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
