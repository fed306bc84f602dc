"""`streamdedup index stats|query|export|import|compact PATH`: inspect and maintain an index from a shell.

stats, query and export open the index read-only, so they work while the service writes (LMDB readers
never block the writer). import and compact take the writer's place: run them with the service stopped.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from itertools import chain
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..minhash import SKETCH_DTYPE
from ..settings import Settings
from ..signature import signing_id
from .record import BYTES_PAYLOAD, SKETCH_PAYLOAD
from .segment import SegmentIndex

__all__ = ["ACTIONS", "parse_fingerprints", "run_index_command"]

ACTIONS = ("stats", "query", "export", "import", "compact")
IMPORT_BATCH = 10_000


def parse_fingerprints(hexes: Sequence[str]) -> np.ndarray:
    """Hex strings (16 digits per 64-bit word, all the same width) -> uint64 (n, words)."""
    widths = {len(h) for h in hexes}
    if len(widths) != 1 or next(iter(widths)) % 16:
        raise ValueError("fingerprints must be hex strings of one width, a multiple of 16 digits")
    try:
        words = [[int(h[i : i + 16], 16) for i in range(0, len(h), 16)] for h in hexes]
    except ValueError:
        raise ValueError("fingerprints must be hexadecimal") from None
    return np.array(words, dtype=np.uint64)


def run_index_command(
    action: str,
    path: Path,
    settings: Settings,
    *,
    fingerprints: Sequence[str] = (),
    min_time: float | None = None,
    source: Path | None = None,
    target: Path | None = None,
    out: IO[str] | None = None,
) -> int:
    out = out if out is not None else sys.stdout
    if action == "stats":
        with _reader(path, settings) as index:
            json.dump(index.stats(), out, indent=2, sort_keys=True)
            out.write("\n")
    elif action == "query":
        fps = parse_fingerprints(fingerprints)
        with _reader(path, settings) as index:
            for hex_fp, matches in zip(fingerprints, index.query(fps, min_time=min_time), strict=True):
                out.write(json.dumps({"fingerprint": hex_fp, "matches": [[i, d] for i, d in matches]}) + "\n")
    elif action == "export":
        with _reader(path, settings) as index, _opened(target, "w", out) as sink:
            for record in index.export():
                sink.write(json.dumps(record) + "\n")
    elif action == "import":
        with _opened(source, "r", sys.stdin) as lines:
            added = _import(path, settings, (json.loads(line) for line in lines if line.strip()))
        out.write(json.dumps({"imported": added}) + "\n")
    elif action == "compact":
        with SegmentIndex(path, None, None, payload_bytes=None) as index:
            before, after = index.compact()
        out.write(json.dumps({"file_bytes_before": before, "file_bytes_after": after}) + "\n")
    else:
        raise ValueError(f"unknown index action {action!r}; one of {', '.join(ACTIONS)}")
    return 0


def _reader(path: Path, settings: Settings) -> SegmentIndex:
    return SegmentIndex.from_settings(settings.index, bits=None, payload_bytes=None, path=path, readonly=True)


def _opened(path: Path | None, mode: str, fallback: IO[str]) -> AbstractContextManager[IO[str]]:
    """The file at ``path`` for the block, or ``fallback`` (stdin/stdout), left open."""
    return open(path, mode, encoding="utf-8") if path is not None else nullcontext(fallback)


def _import(path: Path, settings: Settings, records: Iterable[dict[str, Any]]) -> int:
    batches = _batches(records)
    first = next(batches, None)
    if first is None:
        return 0
    bits = len(first[0]["fingerprint"]) * 4
    if bits != settings.fingerprint.width:
        raise ValueError(
            f"the dump holds {bits}-bit fingerprints but the config's fingerprint.width is {settings.fingerprint.width}"
        )
    payload_bytes = len(first[0]["payload"]) // 2
    # A dump of the decision core's index holds its sketches: stored packed, as that index stores them.
    sketches = payload_bytes == settings.dedup.sketch_size * SKETCH_DTYPE.itemsize
    added = 0
    with SegmentIndex.from_settings(
        settings.index,
        bits=bits,
        payload_bytes=payload_bytes,
        path=path,
        segments=settings.fingerprint.segments,
        signing=signing_id(settings.fingerprint, settings.dedup),
        key_capacity=settings.dedup.key_capacity,
        payload_kind=SKETCH_PAYLOAD if sketches else BYTES_PAYLOAD,
    ) as index:
        for chunk in chain([first], batches):
            index.add(
                [r["id"] for r in chunk],
                parse_fingerprints([r["fingerprint"] for r in chunk]),
                times=[r["time"] for r in chunk],
                payloads=[bytes.fromhex(r["payload"]) for r in chunk],
                origins=[tuple(r["origin"]) if r.get("origin") else None for r in chunk],
            )
            added += len(chunk)
    return added


def _batches(records: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    for record in records:
        chunk.append(record)
        if len(chunk) == IMPORT_BATCH:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
