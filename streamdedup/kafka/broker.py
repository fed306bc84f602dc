"""A local single-node Kafka broker, driven through ``deploy/kafka/kafka.sh`` (the demo and the tests use it)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

__all__ = ["KAFKA_SCRIPT", "BrokerError", "LocalBroker"]

KAFKA_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "kafka.sh"


class BrokerError(RuntimeError):
    """The local broker could not be fetched, started or stopped; the message carries the script's output."""


class LocalBroker:
    """One broker with its own state directory (config, data, logs, pid, ports).

    ``start()`` is idempotent and returns the bootstrap address; ports are kept across stop/start of the same
    state directory, so clients can reconnect to the same address after an outage. ``extra_config`` is a
    properties file appended to the broker's (more listeners, TLS, SASL; the template's ``@BROKER_PORT@``,
    ``@CONTROLLER_PORT@`` and ``@LOG_DIR@`` work there too) and ``format_args`` go to the first storage format
    (SCRAM users: ``--add-scram``).
    """

    def __init__(
        self,
        state_dir: str | Path,
        *,
        script: Path = KAFKA_SCRIPT,
        extra_config: Path | None = None,
        format_args: Sequence[str] = (),
    ) -> None:
        if any(arg.split() != [arg] for arg in format_args):
            raise ValueError(f"format arguments must be non-empty and without blanks, got {list(format_args)}")
        self.state_dir = Path(state_dir).resolve()
        self.script = script
        self.extra_config = extra_config
        self.format_args = tuple(format_args)

    def fetch(self) -> None:
        self._run("fetch", timeout=900)

    def start(self) -> str:
        return self._run("start", timeout=900).strip().splitlines()[-1]

    def stop(self) -> None:
        self._run("stop", timeout=120)

    def running(self) -> bool:
        result = self._invoke("status", timeout=30)
        return result.returncode == 0

    @property
    def bootstrap(self) -> str:
        port = (self.state_dir / "broker.port").read_text().strip()
        return f"127.0.0.1:{port}"

    def _run(self, command: str, *, timeout: float) -> str:
        result = self._invoke(command, timeout=timeout)
        if result.returncode != 0:
            raise BrokerError(f"{self.script} {command} failed ({result.returncode}):\n{result.stderr[-4000:]}")
        return result.stdout

    def _invoke(self, command: str, *, timeout: float) -> subprocess.CompletedProcess[str]:
        if not self.script.is_file():
            raise BrokerError(f"{self.script} not found: the local broker needs a source checkout of streamdedup")
        env = {
            **os.environ,
            "KAFKA_STATE_DIR": str(self.state_dir),
            "KAFKA_EXTRA_CONFIG": "" if self.extra_config is None else str(Path(self.extra_config).resolve()),
            "KAFKA_FORMAT_ARGS": " ".join(self.format_args),
        }
        return subprocess.run(
            [str(self.script), command], env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
