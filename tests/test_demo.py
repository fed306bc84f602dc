from __future__ import annotations

import re
from pathlib import Path

import pytest

from streamdedup.demo import SAMPLE_FEED, run_demo
from streamdedup.offline import dedup_file
from streamdedup.settings import load_settings

pytestmark = pytest.mark.integration


def test_demo_publishes_what_the_offline_mode_keeps_and_dead_letters_the_bad_records(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings(None)
    assert run_demo(settings, bootstrap=kafka_bootstrap, work_dir=tmp_path) == 0
    out = capsys.readouterr().out

    feed_settings = settings.model_copy(
        update={"input": settings.input.model_copy(update={"id_field": "id", "time_field": "time"})}
    )
    offline = dedup_file(
        Path(str(SAMPLE_FEED)), tmp_path / "kept.jsonl", feed_settings, work_dir=tmp_path / "offline", progress=False
    )
    lines = sum(1 for line in Path(str(SAMPLE_FEED)).read_bytes().splitlines() if line.strip())
    assert offline.read == lines and offline.kept < lines

    summary = dict(re.findall(r"^  ([a-z-]+):\s+(\d+)", out, flags=re.MULTILINE))
    assert int(summary["consumed"]) == lines + 3
    assert int(summary["published"]) == offline.kept
    assert int(summary["dropped"]) == sum(offline.dropped.values())
    assert "dead-lettered:  3 (invalid_json 1, not_utf8 1, null_value 1)" in out
    # The duplicates topic's headers say what dropped each: its reason, estimated Jaccard and the threshold.
    examples = re.findall(
        r"^    (feed-\d+) duplicates (feed-\d+): (exact|near), estimated Jaccard (\d\.\d{3}) >= threshold 0\.55 "
        r"\(Hamming distance (\d+)\)$",
        out,
        flags=re.MULTILINE,
    )
    assert len(examples) == 5 and all(a > b and float(jaccard) >= 0.55 for a, b, _, jaccard, _ in examples)
    assert all(
        (jaccard, distance) == ("1.000", "0") for _, _, reason, jaccard, distance in examples if reason == "exact"
    )
    # The same range of Jaccard estimates as the offline mode's over the same feed.
    near = offline.jaccard_range()["near"]
    assert (
        f"    near: estimated Jaccard {near['min']:.3f} to {near['max']:.3f}, "
        f"median {near['median']:.3f}, threshold 0.55\n" in out
    )
