"""Offline mode end to end: JSONL in, kept records out unchanged and in order, bad lines dead-lettered."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from streamdedup.cli import main
from streamdedup.decide import open_index
from streamdedup.index import PlanError
from streamdedup.offline import DedupSummary, Example, dedup_file
from streamdedup.settings import load_settings
from streamdedup.signature import signing_id

CONFIG = Path(__file__).parents[1] / "config.yaml"
BASE = "the quick brown fox jumps over the lazy dog while the farmer watches from the old red barn"


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_kept_records_are_written_unchanged_and_in_order(tmp_path: Path) -> None:
    records = [
        json.dumps({"id": "a", "text": BASE, "extra": [1, 2]}, ensure_ascii=False),
        json.dumps({"id": "b", "text": "RT @x: " + BASE + " http://t.co/1"}),
        json.dumps({"id": "c", "text": "Ein völlig anderer Satz über Datenbanken und das Wetter im Frühling"}),
        "{not json",
        json.dumps({"id": "d", "body": "no text field"}),
        json.dumps({"id": "e", "text": BASE.replace("lazy", "sleepy")}),
    ]
    source = write_lines(tmp_path / "in.jsonl", records)
    summary = dedup_file(source, tmp_path / "out.jsonl", load_settings(CONFIG), work_dir=tmp_path / "idx")
    assert (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines() == [records[0], records[2]]
    assert summary.read == 6 and summary.kept == 2
    assert summary.dropped == {"exact": 1, "near": 1}
    assert summary.threshold == 0.55 and summary.jaccard_range() == {
        "exact": {"min": 1.0, "median": 1.0, "max": 1.0},
        "near": {"min": 0.826, "median": 0.826, "max": 0.826},
    }
    assert [(e.id, e.duplicate_of, e.reason) for e in summary.examples] == [("b", "a", "exact"), ("e", "a", "near")]
    assert summary.dead_lettered == {"invalid_json": 1, "missing_field": 1}
    dead = [json.loads(line) for line in (tmp_path / "out.jsonl.dead-letters.jsonl").read_text().splitlines()]
    assert [d["reason"] for d in dead] == ["invalid_json", "missing_field"]
    assert dead[0]["original"] == "{not json"


def test_the_summary_gives_the_jaccard_range_of_each_reason_with_the_threshold() -> None:
    summary = DedupSummary(threshold=0.55)
    summary.jaccards = {
        "near": [np.array([0.6, 0.9]), np.array([0.7])],
        "exact": [np.array([1.0])],
        "redelivered": [np.zeros(0)],
    }
    summary.examples.append(Example("b", "a", "near", 0.859375, 40))
    described = summary.as_dict()
    assert described["threshold"] == 0.55
    assert described["dropped_jaccard"] == {
        "exact": {"min": 1.0, "median": 1.0, "max": 1.0},
        "near": {"min": 0.6, "median": 0.7, "max": 0.9},
    }
    assert described["examples"] == [
        {"id": "b", "duplicate_of": "a", "reason": "near", "jaccard": 0.859, "distance": 40}
    ]


def test_cli_dedup_and_explain(tmp_path: Path, capsys) -> None:
    source = write_lines(tmp_path / "in.jsonl", [json.dumps({"id": str(i), "text": BASE}) for i in range(3)])
    assert (
        main(
            [
                "--config",
                str(CONFIG),
                "dedup",
                str(source),
                "--output",
                str(tmp_path / "out.jsonl"),
                "--work-dir",
                str(tmp_path / "idx"),
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["kept"] == 1 and summary["dropped"] == {"exact": 2}
    assert summary["threshold"] == 0.55
    assert summary["dropped_jaccard"] == {"exact": {"min": 1.0, "median": 1.0, "max": 1.0}}
    assert summary["examples"][0] == {"id": "1", "duplicate_of": "0", "reason": "exact", "jaccard": 1.0, "distance": 0}

    assert main(["--config", str(CONFIG), "explain", BASE, BASE.replace("lazy", "sleepy")]) == 0
    out = capsys.readouterr().out
    assert "decision on b:        dropped (near duplicate of a)" in out
    assert "a normalised:         'the quick brown fox" in out


def test_config_may_follow_the_command(tmp_path: Path, capsys) -> None:
    # `make demo` and the issue's `streamdedup run --config config.yaml` put the option after the command.
    other = tmp_path / "other.yaml"
    other.write_text("dedup:\n  min_jaccard: 0.99\n", encoding="utf-8")
    text_b = BASE.replace("lazy", "sleepy")
    assert main(["explain", BASE, text_b, "--config", str(other)]) == 0
    assert "decision on b:        kept (novel)" in capsys.readouterr().out
    assert main(["--config", str(CONFIG), "explain", BASE, text_b]) == 0
    assert "dropped (near duplicate of a)" in capsys.readouterr().out


def test_signing_workers_change_nothing_but_speed(tmp_path: Path) -> None:
    from streamdedup.quality.corpus import load_stream

    records = [
        json.dumps({"id": d.id, "text": d.text}, ensure_ascii=False) for d in load_stream(split="holdout")[:5000]
    ]
    source = write_lines(tmp_path / "in.jsonl", records)
    settings = load_settings(CONFIG)
    outputs = []
    for workers in (0, 1, 2):
        configured = settings.model_copy(
            update={"dedup": settings.dedup.model_copy(update={"workers": workers, "batch_size": 700})}
        )
        out = tmp_path / f"out-{workers}.jsonl"
        summary = dedup_file(source, out, configured, work_dir=tmp_path / f"idx-{workers}")
        outputs.append((out.read_text(encoding="utf-8"), summary.as_dict()))
    assert outputs[0] == outputs[1] == outputs[2]
    assert 1000 < outputs[0][1]["kept"] < 5000


def test_batches_follow_the_configured_size_and_a_given_pool_is_used_and_left_running(
    tmp_path: Path, monkeypatch
) -> None:
    from streamdedup.decide import Deduplicator
    from streamdedup.offline import signer_pool

    sizes: list[int] = []
    decide = Deduplicator.decide

    def recording(self, docs, **options):  # type: ignore[no-untyped-def]
        sizes.append(len(docs))
        return decide(self, docs, **options)

    monkeypatch.setattr(Deduplicator, "decide", recording)
    texts = [f"{BASE} number {i} of many" if i % 3 else f"an unrelated text, {i} of them" for i in range(25)]
    source = write_lines(tmp_path / "in.jsonl", [json.dumps({"id": str(i), "text": t}) for i, t in enumerate(texts)])
    settings = load_settings(CONFIG)
    settings = settings.model_copy(update={"dedup": settings.dedup.model_copy(update={"batch_size": 10, "workers": 1})})
    with signer_pool(settings) as pool:
        first = dedup_file(source, tmp_path / "a.jsonl", settings, work_dir=tmp_path / "a", signers=pool)
        assert sizes == [10, 10, 5]
        # The pool still signs after the file is done: the caller owns it.
        assert pool.submit([BASE]).result().fingerprints.shape[0] == 1
    second = dedup_file(source, tmp_path / "b.jsonl", settings, work_dir=tmp_path / "b", batch_size=25)
    assert sizes[3:] == [25]
    assert first.as_dict() == second.as_dict()
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_batches_are_decided_at_the_batch_gc_thresholds_and_the_process_gets_its_own_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    from streamdedup.decide import Deduplicator
    from streamdedup.garbage import BATCH_THRESHOLDS

    seen: list[tuple[int, int, int]] = []
    decide = Deduplicator.decide

    def recording(self, docs, **options):  # type: ignore[no-untyped-def]
        seen.append(gc.get_threshold())
        return decide(self, docs, **options)

    monkeypatch.setattr(Deduplicator, "decide", recording)
    source = write_lines(tmp_path / "in.jsonl", [json.dumps({"id": "a", "text": BASE})])
    before = (700, 10, 10)
    gc.set_threshold(*before)
    try:
        dedup_file(source, tmp_path / "out.jsonl", load_settings(CONFIG), work_dir=tmp_path / "idx")
        assert seen == [BATCH_THRESHOLDS]
        assert gc.get_threshold() == before
    finally:
        gc.set_threshold(*before)


def test_an_index_built_under_other_fingerprint_settings_is_refused(tmp_path: Path) -> None:
    settings = load_settings(CONFIG)
    with open_index(settings, tmp_path / "index"):
        pass
    other = settings.model_copy(update={"fingerprint": settings.fingerprint.model_copy(update={"segment_sample": 64})})
    with pytest.raises(PlanError, match="signing scheme"):
        open_index(other, tmp_path / "index")
    with open_index(settings, tmp_path / "index") as index:
        assert index.signing == signing_id(settings.fingerprint, settings.dedup)
