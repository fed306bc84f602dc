"""HTTP endpoints of the service: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz`` (readiness).

aiohttp serves them on the service's own event loop, so the readiness check reads the service's state
without crossing threads. prometheus-client's built-in server runs in a thread and answers every path with
the metrics page, which leaves no clean place for the probes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from .lifecycle import Lifecycle

__all__ = ["HealthServer", "ReadinessCheck"]

log = logging.getLogger(__name__)

ReadinessCheck = Callable[[], Mapping[str, bool]]
"""Returns each readiness condition by name, e.g. ``{"partitions_assigned": True, "index_open": True,
"producer_ready": False}``; the service is ready when every condition holds."""


class HealthServer(Lifecycle):
    """Serves the three endpoints on ``host:port`` (port 0 picks a free port; see :attr:`port`).

    liveness: conditions that must hold for the process to be worth keeping (a crashed consume loop makes it
    fail, so the orchestrator restarts the pod); by default the process is alive while it answers at all.
    reasons: why conditions fail, by condition name; ``/readyz`` adds them to its body as ``reasons``.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: ReadinessCheck,
        *,
        host: str = "0.0.0.0",
        port: int = 8000,
        liveness: ReadinessCheck | None = None,
        reasons: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self._registry = registry
        self._readiness = readiness
        self._liveness = liveness
        self._reasons = reasons
        self._host = host
        self._requested_port = port
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The port actually bound (differs from the configured one when that was 0)."""
        if self._port is None:
            raise RuntimeError("the health server is not started")
        return self._port

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._requested_port)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = runner.addresses[0][1]
        log.info("serving /metrics, /healthz and /readyz", extra={"host": self._host, "port": self._port})

    async def stop(self) -> None:
        """Idempotent: stopping a stopped server does nothing."""
        runner, self._runner, self._port = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        # aiohttp's content_type argument refuses parameters (version, charset), so set the header whole.
        return web.Response(body=encoder(self._registry), headers={"Content-Type": content_type})

    async def _healthz(self, request: web.Request) -> web.Response:
        return _conditions_response(self._liveness() if self._liveness is not None else {"serving": True})

    async def _readyz(self, request: web.Request) -> web.Response:
        return _conditions_response(self._readiness(), self._reasons() if self._reasons is not None else {})


def _conditions_response(conditions: Mapping[str, bool], reasons: Mapping[str, str] | None = None) -> web.Response:
    ok = bool(conditions) and all(conditions.values())
    body: dict[str, object] = {
        "status": "ok" if ok else "unavailable",
        "checks": {name: bool(value) for name, value in conditions.items()},
    }
    if reasons:
        body["reasons"] = dict(reasons)
    return web.json_response(body, status=200 if ok else 503)
