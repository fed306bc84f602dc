"""Transactional ids on a shared cluster: deployments never fence each other, and an instance frozen past its
timeouts is fenced by the one that replaced it and publishes nothing when it wakes (real broker, real
``streamdedup run`` processes for the freeze)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from streamdedup.cli import EXIT_FENCED
from streamdedup.service import DedupService
from streamdedup.settings import load_settings
from tests.conftest import OutRecord, consume_records, process_state, produce_records
from tests.test_service import (
    Topics,
    _logged,
    overrides,
    start_service,
    wait_for,
    write_config,
)

pytestmark = pytest.mark.integration


def stories(first: int, count: int) -> list[OutRecord]:
    """Distinct documents, none a near-copy of another."""
    return [
        OutRecord(json.dumps({"text": f"story {i} " + " ".join(f"s{i}w{j}" for j in range(12))}).encode())
        for i in range(first, first + count)
    ]


def derived(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the transactional id left to its default (derived from the group)."""
    del config["kafka"]["transactional_id"]
    return config


async def test_two_deployments_with_their_own_groups_never_fence_each_other(
    kafka_bootstrap: str, topic_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    source = await topic_factory(1, prefix="in")
    deployments = []
    for name in ("east", "west"):
        topics = Topics(
            input=source,
            output=await topic_factory(1, prefix=f"out-{name}"),
            duplicates=await topic_factory(1, prefix=f"dup-{name}"),
            dead_letters=await topic_factory(1, prefix=f"dlq-{name}"),
        )
        deployments.append(
            (topics, load_settings(None, **derived(overrides(kafka_bootstrap, topics, tmp_path / name))))
        )
    (east_topics, east), (west_topics, west) = deployments
    assert east.kafka.transactional_id is None and west.kafka.transactional_id is None
    assert east.kafka.producer_transactional_id == east.kafka.group_id
    assert west.kafka.producer_transactional_id == west.kafka.group_id != east.kafka.group_id

    async with DedupService(east) as first:
        await produce_records(kafka_bootstrap, source, stories(0, 20))
        await wait_for(lambda: _published(first, 20), 60, "the first deployment to publish")
        # The second starts while the first runs: its producer must not fence the first one's.
        async with DedupService(west) as second:
            await wait_for(lambda: _published(second, 20), 60, "the second deployment to catch up")
            await produce_records(kafka_bootstrap, source, stories(20, 20))
            await wait_for(lambda: _published(first, 40), 60, "the first deployment to publish again")
            await wait_for(lambda: _published(second, 40), 60, "the second deployment to publish again")
    for topics in (east_topics, west_topics):
        output = await consume_records(kafka_bootstrap, topics.output)
        assert sorted(record.value for record in output) == sorted(record.value for record in stories(0, 40))
    # Neither session was ever broken (a fenced producer ends its session with a Kafka error).
    assert not [record.getMessage() for record in caplog.records if "Kafka error" in record.getMessage()]


async def _published(service: DedupService, n: int) -> bool:
    return service.stats.published >= n


# Short group and transaction timeouts (the broker's smallest session timeout is 6 s) keep the freeze brief.
_SESSION_MS = 6000
_TRANSACTION_MS = 6000


def json_logs(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def copies(records: list[OutRecord], partitions: int) -> list[OutRecord]:
    """The same values again, on other partitions than the originals went to."""
    return [OutRecord(record.value, partition=(i + 1) % partitions) for i, record in enumerate(records)]


@pytest.mark.parametrize("input_while_frozen", [True, False], ids=["input-while-frozen", "idle"])
async def test_an_instance_frozen_past_its_timeouts_is_fenced_and_publishes_nothing_when_it_wakes(
    kafka_bootstrap: str, topic_factory: Any, tmp_path: Path, input_while_frozen: bool
) -> None:
    """A (``streamdedup run``) publishes, is frozen (SIGSTOP) past its session and transaction timeouts, and
    B, started as its replacement (same group, so the same default transactional id; its own index), fences it
    and takes the input over. A, continued (SIGCONT), learns it was fenced and exits with EXIT_FENCED, having
    published nothing more: with input that arrived while it was frozen, it fetches and decides that input
    from its old assignment and is refused the transaction; idle, it rejoins the group and checks its producer
    at the rebalance (it would otherwise idle split with B for good). B's output holds every story once."""
    partitions = 2
    topics = Topics(
        input=await topic_factory(partitions, prefix="in"),
        output=await topic_factory(1, prefix="out"),
        duplicates=await topic_factory(1, prefix="dup"),
        dead_letters=await topic_factory(1, prefix="dlq"),
    )

    def config(name: str, group: str | None = None) -> Path:
        settings = derived(
            overrides(
                kafka_bootstrap,
                topics,
                tmp_path / f"index-{name}",
                session_timeout_ms=_SESSION_MS,
                transaction_timeout_ms=_TRANSACTION_MS,
            )
        )
        settings["kafka"]["group_id"] = group or settings["kafka"]["group_id"]
        settings["dedup"] = {"workers": 0}
        settings["logging"] = {"format": "json"}
        return write_config(tmp_path / f"{name}.yaml", settings)

    def spread(records: list[OutRecord]) -> list[OutRecord]:
        return [OutRecord(record.value, partition=i % partitions) for i, record in enumerate(records)]

    async def output_holds(n: int) -> bool:
        return len(await consume_records(kafka_bootstrap, topics.output)) >= n

    a_config = config("a")
    group = load_settings(a_config).kafka.group_id
    b_config = config("b", group)
    assert load_settings(b_config).kafka.producer_transactional_id == group
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    a = start_service(a_config, a_log)
    b = None
    try:
        await produce_records(kafka_bootstrap, topics.input, spread(stories(0, 20)))
        # A starts cold (its decision process, the group join): on a loaded host that takes a while.
        await wait_for(lambda: output_holds(20), 120, "A to publish the first stories")

        a.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        await wait_for(lambda: _state_is(a.pid, "T"), 10, "A to stop")
        # New stories and copies of published ones.
        second = spread(stories(20, 20)) + copies(stories(0, 5), partitions)
        if input_while_frozen:
            await produce_records(kafka_bootstrap, topics.input, second)
        b = start_service(b_config, b_log)
        await wait_for(lambda: _logged(b_log, "owning all"), 90, "B to take over once A's session expired")
        await asyncio.sleep(max(0.0, frozen + 1.5 * max(_SESSION_MS, _TRANSACTION_MS) / 1000 - time.monotonic()))

        a.send_signal(signal.SIGCONT)
        assert await asyncio.to_thread(a.wait, 60) == EXIT_FENCED
        if not input_while_frozen:
            await produce_records(kafka_bootstrap, topics.input, second)
        await wait_for(lambda: output_holds(40), 90, "B to publish the second stories")
        await produce_records(
            kafka_bootstrap, topics.input, spread(stories(40, 20)) + copies(stories(20, 5), partitions)
        )
        await wait_for(lambda: output_holds(60), 90, "B to go on alone")
        await asyncio.sleep(2)  # time for anything extra to show up
        output = await consume_records(kafka_bootstrap, topics.output)
    finally:
        a.send_signal(signal.SIGCONT)
        a.kill()
        # Reaped here, so a failure above leaves no running process behind for later tests to trip over.
        await asyncio.to_thread(a.wait, 30)
        if b is not None:
            b.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(b.wait, 30) == 0
    assert sorted(record.value for record in output) == sorted(record.value for record in stories(0, 60))
    # A's last words: fenced, with only the first stories ever published, and no uncaught exception (whose
    # traceback Python would print outside the JSON log lines).
    fenced = [entry for entry in json_logs(a_log) if entry["message"].startswith("FENCED")]
    assert len(fenced) == 1 and fenced[0]["level"] == "ERROR", a_log.read_text()[-3000:]
    assert fenced[0]["published"] == 20
    assert not [line for line in a_log.read_text().splitlines() if line.startswith("Traceback")]


async def _state_is(pid: int, state: str) -> bool:
    return process_state(pid) == state
