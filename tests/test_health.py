"""The real HTTP server: liveness, readiness that follows the service's state, a clean start and stop."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from streamdedup.health import HealthServer


class ServiceState:
    """The three readiness conditions of the Kafka service, switched by the test."""

    def __init__(self) -> None:
        self.partitions_assigned = False
        self.index_open = False
        self.producer_ready = False

    def readiness(self) -> dict[str, bool]:
        return {
            "partitions_assigned": self.partitions_assigned,
            "index_open": self.index_open,
            "producer_ready": self.producer_ready,
        }


async def get(port: int, path: str) -> tuple[int, object]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as response:
        return response.status, await response.json() if response.content_type == "application/json" else None


async def test_readyz_flips_with_each_condition() -> None:
    state = ServiceState()
    async with HealthServer(CollectorRegistry(), state.readiness, host="127.0.0.1", port=0) as server:
        status, body = await get(server.port, "/readyz")
        assert status == 503
        assert body == {
            "status": "unavailable",
            "checks": {"partitions_assigned": False, "index_open": False, "producer_ready": False},
        }
        state.index_open = True
        state.producer_ready = True
        status, body = await get(server.port, "/readyz")
        assert status == 503 and body["checks"]["partitions_assigned"] is False
        state.partitions_assigned = True
        status, body = await get(server.port, "/readyz")
        assert (status, body["status"]) == (200, "ok")
        # A rebalance that revokes everything makes the pod unready again.
        state.partitions_assigned = False
        assert (await get(server.port, "/readyz"))[0] == 503


async def test_healthz_is_alive_while_not_ready() -> None:
    state = ServiceState()
    async with HealthServer(CollectorRegistry(), state.readiness, host="127.0.0.1", port=0) as server:
        assert await get(server.port, "/healthz") == (200, {"status": "ok", "checks": {"serving": True}})
        assert (await get(server.port, "/readyz"))[0] == 503


async def test_liveness_check_fails_healthz() -> None:
    alive = {"consume_loop": True}
    async with HealthServer(
        CollectorRegistry(), lambda: {"x": True}, host="127.0.0.1", port=0, liveness=lambda: dict(alive)
    ) as server:
        assert (await get(server.port, "/healthz"))[0] == 200
        alive["consume_loop"] = False
        assert await get(server.port, "/healthz") == (503, {"status": "unavailable", "checks": {"consume_loop": False}})


async def test_readyz_says_why_a_condition_fails() -> None:
    reasons: dict[str, str] = {"index_storing": "index map is full at max_map_size=65536 bytes"}
    async with HealthServer(
        CollectorRegistry(),
        lambda: {"index_storing": not reasons},
        host="127.0.0.1",
        port=0,
        reasons=lambda: reasons,
    ) as server:
        assert await get(server.port, "/readyz") == (
            503,
            {
                "status": "unavailable",
                "checks": {"index_storing": False},
                "reasons": {"index_storing": "index map is full at max_map_size=65536 bytes"},
            },
        )
        reasons.clear()
        assert await get(server.port, "/readyz") == (200, {"status": "ok", "checks": {"index_storing": True}})


async def test_no_conditions_is_not_ready() -> None:
    async with HealthServer(CollectorRegistry(), dict, host="127.0.0.1", port=0) as server:
        assert (await get(server.port, "/readyz"))[0] == 503


async def test_unknown_path_is_404_and_post_is_refused() -> None:
    async with HealthServer(CollectorRegistry(), dict, host="127.0.0.1", port=0) as server:
        assert (await get(server.port, "/"))[0] == 404
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{server.port}/readyz") as response,
        ):
            assert response.status == 405


async def test_stop_releases_the_port_and_is_idempotent() -> None:
    server = HealthServer(CollectorRegistry(), dict, host="127.0.0.1", port=0)
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.port
    await server.start()
    port = server.port
    await server.stop()
    await server.stop()
    with socket.create_server(("127.0.0.1", port)):
        pass
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(port, "/healthz")


async def test_port_in_use_is_a_clear_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        server = HealthServer(CollectorRegistry(), dict, host="127.0.0.1", port=port)
        with pytest.raises(OSError):
            await server.start()
        await server.stop()
