"""`streamdedup replay`: the decider's calls as its verdict records name them, and on the real broker, after a
scaled-out deployment of ``streamdedup run`` processes decided natural text under tight candidate bounds, the same
documents stored, and what other settings decide otherwise named."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka.structs import ConsumerRecord

from streamdedup.cli import main
from streamdedup.kafka.verdict_records import BatchVerdicts
from streamdedup.replay import _calls, _verdicts
from tests.test_scale_out import Deployment, natural, started
from tests.test_scale_out import deployment as deployment  # the fixture
from tests.test_service import STREAMDEDUP, write_config


def ids(records: list[ConsumerRecord]) -> list[str]:
    return [json.loads(record.value or b"")["id"] for record in records]


async def replayed(deployment: Deployment, name: str, **dedup: Any) -> tuple[int, dict[str, Any]]:
    """``streamdedup replay`` with the deployment's settings, and these dedup settings over them: its exit status
    and its report."""
    settings = deployment.settings(name)
    settings["dedup"] = {**settings["dedup"], **dedup}
    config = write_config(deployment.root / f"{name}.yaml", settings)
    done = await asyncio.to_thread(
        subprocess.run,
        [str(STREAMDEDUP), "replay", "--config", str(config), "--work-dir", str(deployment.root / name)],
        capture_output=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr.decode()
    return done.returncode, json.loads(done.stdout)


def batch(first: int, end: int, leads: bool, closes: bool) -> BatchVerdicts:
    return BatchVerdicts(first, end, leads, closes, np.ones(end - first, dtype=bool))


def spans(calls: list[list[BatchVerdicts]]) -> list[list[tuple[int, int, bool]]]:
    """Each call's batches as (first, end, compared)."""
    return [[(each.first, each.end, len(each.stored) > 0) for each in call] for call in calls]


def test_calls_are_the_deciders_and_what_no_verdict_record_covers_is_a_call_of_its_own() -> None:
    recorded = [
        batch(0, 2, True, False),
        batch(2, 3, False, True),
        batch(3, 5, True, True),
        batch(7, 8, False, True),  # a call whose first batch's verdict record is gone
        batch(8, 9, True, False),  # its decider died here: the next batch begins another call
        batch(9, 11, True, True),
    ]
    assert spans(list(_calls(recorded, 0))) == [
        [(0, 2, True), (2, 3, True)],
        [(3, 5, True)],
        [(5, 7, False)],
        [(7, 8, True)],
        [(8, 9, True)],
        [(9, 11, True)],
    ]
    # From where the sequence topic begins: what is gone is skipped, a batch cut there is decided, not compared.
    assert spans(list(_calls(recorded, 4))) == [
        [(4, 5, False)],
        [(5, 7, False)],
        [(7, 8, True)],
        [(8, 9, True)],
        [(9, 11, True)],
    ]


def test_a_verdict_record_that_cannot_be_read_is_skipped_and_what_it_covered_decided_uncompared() -> None:
    records = [
        ConsumerRecord("seq.verdicts", 0, offset, 0, 0, None, value, None, -1, len(value), [])
        for offset, value in enumerate([batch(0, 2, True, True).packed(), b"\xc1", batch(5, 6, True, True).packed()])
    ]
    readable = _verdicts(records)
    assert [(each.first, each.end) for each in readable] == [(0, 2), (5, 6)]
    assert spans(list(_calls(readable, 0))) == [[(0, 2, True)], [(2, 5, False)], [(5, 6, True)]]


def test_a_replay_needs_a_scaled_out_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["replay", "--work-dir", str(tmp_path)]) == 2
    assert "kafka.sequence_topic" in capsys.readouterr().err


@pytest.mark.integration
async def test_a_replay_stores_what_the_decider_stored_and_names_what_other_settings_decide_otherwise(
    deployment: Deployment,
) -> None:
    deployment.dedup = {"max_candidates": 2, "key_capacity": 4}
    await started(deployment, ["a", "b"])
    produced = natural(0, 1500)
    await deployment.produce(produced)
    await deployment.settled(len(produced))
    assert deployment.stop_all() == {"a": 0, "b": 0}
    output, duplicates, _ = await deployment.results()
    assert 0 < len(duplicates) < len(produced)

    status, report = await replayed(deployment, "same")
    assert status == 0
    assert report["input_records"] == len(produced)
    assert report["stored_by_the_decider"] == report["stored_by_the_replay"] == len(output)
    assert report["differ"] == 0
    assert report["not_covered_by_verdict_records"] == 0
    assert 1 <= report["calls"] <= report["batches"]

    # A stricter threshold keeps near copies the deployment dropped.
    status, report = await replayed(deployment, "stricter", min_jaccard=0.95)
    assert status == 1
    assert report["stored_by_the_decider"] == len(output)
    assert report["stored_by_the_replay"] > len(output)
    assert report["stored_by_the_replay_only"]
    assert set(report["stored_by_the_replay_only"]) <= set(ids(duplicates))
    assert set(report["stored_by_the_decider_only"]) <= set(ids(output))
