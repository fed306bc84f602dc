"""The signing worker processes of the service: started with it, replaced in the background when one dies."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future

from ..decision_process import DecisionProcess
from ..lifecycle import Lifecycle, StopRequest
from ..metrics import ServiceMetrics
from ..settings import Settings
from ..signature import Signatures, SignerPool
from ..workers import WorkerDied
from .backoff import Backoff

__all__ = ["SignerSupervisor"]

log = logging.getLogger(__name__)

# New signing workers after a death: at once after a pool that lived this long, else after a pause that doubles
# up to its maximum (a pool that keeps dying, or a host that refuses processes, is not hammered).
_SIGNERS_HEALTHY_SECONDS = 60.0
_SIGNERS_RETRY_SECONDS = 1.0
_SIGNERS_RETRY_MAX_SECONDS = 60.0


class SignerSupervisor(Lifecycle):
    """``start()`` spawns ``dedup.workers`` signing workers (none: the decision core signs every batch) once the
    index is open (``keyed``: they key batches under its plan, for the decision core; else they only sign, for
    a sequencer, whose batches the decider keys together); ``stop()`` stops them and any replacement under way."""

    def __init__(
        self,
        settings: Settings,
        decisions: DecisionProcess,
        metrics: ServiceMetrics,
        stop: StopRequest,
        *,
        keyed: bool = True,
    ) -> None:
        self._settings = settings
        self._keyed = keyed
        self._decisions = decisions
        self._metrics = metrics
        self._stop = stop
        self._signers: SignerPool | None = None
        self._started = 0.0
        self._backoff = Backoff(_SIGNERS_RETRY_SECONDS, _SIGNERS_RETRY_MAX_SECONDS, at_once=True)
        self._respawning: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Spawn the signing workers and wait until they can sign (a first batch would wait for that)."""
        if self._settings.dedup.workers:
            await self._warm_up(self._spawn())

    async def stop(self) -> None:
        respawning, self._respawning = self._respawning, None
        if respawning is not None:
            respawning.cancel()
            await asyncio.gather(respawning, return_exceptions=True)
        signers, self._signers = self._signers, None
        if signers is not None:
            await asyncio.to_thread(signers.stop)

    def submit(self, texts: Sequence[str]) -> Future[Signatures] | None:
        """The workers' signatures of ``texts`` to come; None while there are no workers."""
        signers = self._signers
        return None if signers is None else signers.submit(texts)

    @staticmethod
    async def signatures(signing: Future[Signatures] | None) -> Signatures | None:
        """What ``submit`` gave, once signed; None (the decision core signs the batch) without workers or when
        one died."""
        if signing is None:
            return None
        try:
            return await asyncio.wrap_future(signing)
        except WorkerDied:
            return None

    def _spawn(self) -> SignerPool:
        loop = asyncio.get_running_loop()
        self._signers = SignerPool(
            self._settings.fingerprint,
            self._settings.dedup,
            self._settings.dedup.workers,
            self._decisions.plan if self._keyed else None,
            # Every death of one of its workers, found the moment it happens (the stream may be idle), and only
            # there: a batch whose worker died is signed by the decision core and reports nothing.
            on_death=lambda pool: self._report_death(loop, pool),
        )
        self._started = time.monotonic()
        return self._signers

    async def _warm_up(self, signers: SignerPool) -> None:
        await asyncio.gather(*map(asyncio.wrap_future, signers.warm_up()))
        log.info("%d signing workers ready", signers.workers, extra={"pids": signers.pids})

    def _report_death(self, loop: asyncio.AbstractEventLoop, pool: SignerPool) -> None:
        """From the pool's helper thread: hand the death over to the event loop."""
        loop.call_soon_threadsafe(self._died, pool)

    def _died(self, signers: SignerPool) -> None:
        """A worker of ``signers`` died: the decision core signs the batches until new workers are ready. Once
        per broken pool (its other workers may die with it)."""
        if signers is not self._signers:
            return
        self._signers = None
        self._metrics.record_worker_death("signer")
        log.error("a signing worker died; the decision core signs the batches until new workers are ready")
        if time.monotonic() - self._started > _SIGNERS_HEALTHY_SECONDS:
            self._backoff.reset()
        self._respawn(signers)

    def _respawn(self, dead: SignerPool | None) -> None:
        """Start new signing workers in the background: at once after a pool that lived, else after a pause."""
        pause = self._backoff.pause()
        log.info("new signing workers start in %.0f s", pause)
        self._respawning = asyncio.create_task(self._replaced(dead, pause), name="streamdedup-signers")

    async def _replaced(self, dead: SignerPool | None, pause: float) -> None:
        if dead is not None:
            await asyncio.to_thread(dead.stop)  # its other workers finish the batches they hold
        await self._stop.sleep(pause)
        if self._stop.is_set():
            return
        try:
            signers = self._spawn()
        except Exception as exc:  # a host that refuses new processes
            log.error("new signing workers did not start (not spawned): %r", exc)
            self._respawn(None)
            return
        try:
            await self._warm_up(signers)
        except Exception as exc:  # a worker that died starting: its on_death replaces the pool
            log.error("new signing workers did not start: %r", exc)
