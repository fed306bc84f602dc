"""End to end: a real Prometheus scrapes `streamdedup run` working against the real broker; every query of the
Grafana dashboard, evaluated through Prometheus' HTTP API, returns data; the alert rules load and evaluate."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import yaml

from tests.deploy.support import DEPLOY

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "streamdedup.json"
SCRAPE_SECONDS = 1
# Grafana's $__rate_interval is at least four scrape intervals; a little more keeps rates steady here.
RATE_INTERVAL = "10s"


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


def dashboard_queries() -> list[tuple[str, str, str]]:
    board = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", RATE_INTERVAL).replace("$instance", ".*")
            assert "$" not in expr, expr
            queries.append((panel["title"], target["refId"], expr))
    return queries


@contextlib.contextmanager
def process(args: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def wait_until(check: Callable[[], Awaitable[bool]], what: str, timeout: float, logs: list[Path]) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.5)
    except TimeoutError:
        tails = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for log in logs)
        pytest.fail(f"timed out waiting for {what}\n{tails}")


class Traffic:
    """Keeps documents flowing into the input topic: novel ones, exact re-sends, and unreadable records."""

    def __init__(self, produce: Callable[..., Awaitable[None]], topic: str) -> None:
        self._produce = produce
        self._topic = topic
        self._rng = np.random.default_rng(2026)
        self._vocabulary = [f"w{n}" for n in range(5000)]
        self._sent: list[bytes] = []
        self.count = 0

    def _novel(self) -> bytes:
        words = self._rng.choice(self._vocabulary, size=40)
        return json.dumps({"text": " ".join(words)}).encode()

    async def send_batch(self, size: int = 40) -> None:
        batch: list[bytes] = []
        for _ in range(size):
            roll = self._rng.random()
            if roll < 0.1:
                batch.append(b"{not json")
            elif roll < 0.4 and self._sent:
                batch.append(self._sent[int(self._rng.integers(len(self._sent)))])
            else:
                value = self._novel()
                self._sent.append(value)
                batch.append(value)
        await self._produce(self._topic, batch)
        self.count += len(batch)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.send_batch()
            await asyncio.sleep(0.5)


async def test_every_dashboard_query_returns_data_from_a_real_prometheus(
    tmp_path: Path,
    kafka_bootstrap: str,
    topic_factory: Callable[..., Awaitable[str]],
    kafka_produce: Callable[..., Awaitable[None]],
) -> None:
    prometheus_binary = shutil.which("prometheus")
    if prometheus_binary is None:
        pytest.fail("the prometheus server is not on PATH; `make promtool` installs Debian's prometheus package")
    input_topic = await topic_factory(2, prefix="e2e-in")
    suffix = uuid.uuid4().hex[:8]
    service_port, prometheus_port = free_port(), free_port()

    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kafka": {
                    "bootstrap_servers": kafka_bootstrap,
                    "input_topics": [input_topic],
                    "output_topic": f"e2e-out-{suffix}",
                    "dead_letter_topic": f"e2e-dlq-{suffix}",
                    "group_id": f"e2e-{suffix}",
                    "transactional_id": f"e2e-{suffix}",
                },
                "index": {"path": str(tmp_path / "index"), "expected_entries": 100_000},
                "metrics": {"host": "127.0.0.1", "port": service_port},
                "logging": {"format": "json"},
            }
        )
    )
    prometheus_config = tmp_path / "prometheus.yml"
    prometheus_config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
                "rule_files": [str(DEPLOY / "prometheus" / "alerts.yml")],
                "scrape_configs": [
                    {"job_name": "streamdedup", "static_configs": [{"targets": [f"127.0.0.1:{service_port}"]}]}
                ],
            }
        )
    )
    env = {name: value for name, value in os.environ.items() if not name.startswith("STREAMDEDUP_")}
    service_log, prometheus_log = tmp_path / "service.log", tmp_path / "prometheus.log"
    logs = [service_log, prometheus_log]
    service_args = [str(Path(sys.executable).parent / "streamdedup"), "--config", str(config), "run"]
    prometheus_args = [
        prometheus_binary,
        f"--config.file={prometheus_config}",
        f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
        f"--web.listen-address=127.0.0.1:{prometheus_port}",
        "--log.level=warn",
    ]
    api = f"http://127.0.0.1:{prometheus_port}/api/v1"

    with process(service_args, service_log, env), process(prometheus_args, prometheus_log):
        async with aiohttp.ClientSession() as http:

            async def get(url: str, **params: str) -> Any:
                try:
                    async with http.get(url, params=params) as response:
                        return await response.json() if response.status == 200 else None
                except aiohttp.ClientError:
                    return None

            async def ready() -> bool:
                return (await get(f"http://127.0.0.1:{service_port}/readyz")) is not None

            async def query(expr: str) -> list[dict[str, Any]]:
                body = await get(f"{api}/query", query=expr)
                assert body is not None and body["status"] == "success", (expr, body)
                return body["data"]["result"]

            await wait_until(ready, "the service to become ready", 90, logs)
            stop = asyncio.Event()
            traffic = asyncio.create_task(Traffic(kafka_produce, input_topic).run(stop))
            try:
                await check_dashboard_and_rules(query, get, api, logs)
            finally:
                stop.set()
                await traffic


async def check_dashboard_and_rules(
    query: Callable[[str], Awaitable[list[dict[str, Any]]]],
    get: Callable[..., Awaitable[Any]],
    api: str,
    logs: list[Path],
) -> None:
    async def busy_long_enough() -> bool:
        # Enough history for rate() over RATE_INTERVAL, and a stats refresh of the index gauges.
        seen = await query('sum(streamdedup_messages_consumed_total{job="streamdedup"})')
        entries = await query("max_over_time(streamdedup_index_entries[1m])")
        return bool(seen) and float(seen[0]["value"][1]) >= 600 and bool(entries) and float(entries[0]["value"][1]) > 0

    await wait_until(busy_long_enough, "Prometheus to see the service at work", 120, logs)

    dead: list[str] = []
    for title, ref, expr in dashboard_queries():
        result = await query(expr)
        values = [float(series["value"][1]) for series in result]
        if not values or not any(math.isfinite(value) for value in values):
            dead.append(f"{title} [{ref}]: {expr} -> {result}")
    assert not dead, "dashboard queries without data:\n" + "\n".join(dead)

    # The real server loads the alert rules and evaluates each without error on live data.
    rules = (await get(f"{api}/rules"))["data"]["groups"]
    evaluated = {rule["name"]: rule for group in rules for rule in group["rules"]}
    rule_file = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    assert set(evaluated) == {rule["alert"] for group in rule_file["groups"] for rule in group["rules"]}
    assert {rule["health"] for rule in evaluated.values()} == {"ok"}, evaluated
    # The service is up and committing: neither of these may fire.
    assert evaluated["StreamdedupDown"]["state"] == "inactive"
    assert evaluated["StreamdedupNoCommit"]["state"] == "inactive"
