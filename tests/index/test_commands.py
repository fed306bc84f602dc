from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from streamdedup.cli import main as cli_main
from streamdedup.index import SKETCH_PAYLOAD, SegmentIndex
from streamdedup.index.commands import parse_fingerprints, run_index_command
from streamdedup.minhash import EMPTY_SLOT
from streamdedup.settings import Settings


@pytest.fixture
def filled(tmp_path: Path) -> tuple[Path, np.ndarray]:
    fps = np.random.default_rng(1).integers(0, 2**64 - 1, size=(300, 2), dtype=np.uint64, endpoint=True)
    path = tmp_path / "source"
    with SegmentIndex(path, 128, 3, expected_entries=1000, payload_bytes=3) as index:
        index.add(
            [f"id{i}" for i in range(300)],
            fps,
            times=np.arange(300.0) + 1000.0,
            payloads=[bytes([i % 256, 1, 2]) for i in range(300)],
            origins=[("topic", 0, i) if i % 2 else None for i in range(300)],
            source_offsets={("topic", 0): 300},
        )
    return path, fps


# The fixture's index: classic 128-bit SimHash at radius 3 (the default config is segmented 1024-bit).
CLASSIC_128 = Settings(fingerprint={"width": 128, "segments": 1}, index={"radius": 3})


def _run(action: str, path: Path, **kwargs: object) -> str:
    out = io.StringIO()
    assert run_index_command(action, path, CLASSIC_128, out=out, **kwargs) == 0
    return out.getvalue()


def test_stats_query_and_export_read_the_index(filled: tuple[Path, np.ndarray]) -> None:
    path, fps = filled
    stats = json.loads(_run("stats", path))
    assert stats["entries"] == 300
    assert stats["plan"]["bits"] == 128 and stats["plan"]["kind"] == "exact"
    assert stats["table_values"] == "folds"  # a radius: the fold check rejects candidates before their records
    assert stats["table_layout"] == "buckets"  # fold-valued keys hold several rows each: packed, one LMDB value a key
    assert stats["source_offsets"] == {"topic:0": 300}
    assert stats["table_bytes"] > 0 and stats["disk_bytes"] >= stats["table_bytes"]
    hexes = ["".join(f"{int(w):016x}" for w in fps[i]) for i in (0, 7)]
    lines = [json.loads(line) for line in _run("query", path, fingerprints=hexes).splitlines()]
    assert lines == [
        {"fingerprint": hexes[0], "matches": [["id0", 0]]},
        {"fingerprint": hexes[1], "matches": [["id7", 0]]},
    ]
    assert json.loads(_run("query", path, fingerprints=hexes[:1], min_time=2000.0))["matches"] == []
    exported = [json.loads(line) for line in _run("export", path).splitlines()]
    assert len(exported) == 300
    assert exported[7] == {
        "id": "id7",
        "fingerprint": hexes[1],
        "time": 1007.0,
        "origin": ["topic", 0, 7],
        "payload": "070102",
    }
    assert exported[8]["origin"] is None


def test_export_then_import_rebuilds_an_equal_index(filled: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    path, fps = filled
    dump = tmp_path / "dump.jsonl"
    _run("export", path, target=dump)
    copy = tmp_path / "copy"
    assert json.loads(_run("import", copy, source=dump)) == {"imported": 300}
    assert _run("export", copy) == dump.read_text()
    with SegmentIndex(copy, 128, 3, payload_bytes=3) as index:
        assert index.query(fps[:2] ^ np.uint64(1)) == [[("id0", 2)], [("id1", 2)]]


def test_a_dump_of_sketches_imports_into_packed_sketches(tmp_path: Path) -> None:
    # The decision core's payloads are bottom-k sketches of dedup.sketch_size values: the import stores them
    # packed, and exports them again unchanged.
    rng = np.random.default_rng(2)
    fps = rng.integers(0, 2**64 - 1, size=(50, 2), dtype=np.uint64, endpoint=True)
    sketches = np.sort(rng.integers(0, 2**31, size=(50, 64), dtype=np.uint32), axis=1)
    sketches[::3, 40:] = EMPTY_SLOT
    with SegmentIndex(tmp_path / "source", 128, 3, payload_bytes=256, payload_kind=SKETCH_PAYLOAD) as index:
        index.add([f"s{i}" for i in range(50)], fps, payloads=list(map(bytes, sketches.view(np.uint8))))
    dump = tmp_path / "dump.jsonl"
    _run("export", tmp_path / "source", target=dump)
    assert json.loads(_run("import", tmp_path / "copy", source=dump)) == {"imported": 50}
    assert _run("export", tmp_path / "copy") == dump.read_text()
    stats = json.loads(_run("stats", tmp_path / "copy"))
    assert (stats["record_layout"], stats["payload_kind"]) == ("packed", SKETCH_PAYLOAD)


def test_compact_keeps_every_entry(filled: tuple[Path, np.ndarray]) -> None:
    path, fps = filled
    with SegmentIndex(path, 128, 3, payload_bytes=3) as index:
        index.remove([f"id{i}" for i in range(0, 300, 2)])
    report = json.loads(_run("compact", path))
    assert report["file_bytes_after"] <= report["file_bytes_before"]
    with SegmentIndex(path, 128, 3, payload_bytes=3) as index:
        assert len(index) == 150
        assert [len(hits) for hits in index.query(fps[:4])] == [0, 1, 0, 1]


def test_cli_parses_and_hands_off(filled: tuple[Path, np.ndarray], capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = filled
    assert cli_main(["index", "stats", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 300


def test_bad_fingerprints_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match="hex"):
        parse_fingerprints(["xyz0000000000000"])
    with pytest.raises(ValueError, match="one width"):
        parse_fingerprints(["00", "0000000000000000"])
