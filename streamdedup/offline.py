"""Offline mode: deduplicate a JSONL file through the same decision core as the service.

Kept records are written unchanged (the original line bytes), in input order. Records that cannot be read
(bad JSON, no text, ...) are never dropped silently: they go to a dead-letter file with the reason.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from .decide import Deduplicator, Verdict
from .document import DeadLetter, Document, DocumentDecoder
from .index import SegmentIndex
from .settings import Settings

__all__ = ["DedupSummary", "dedup_file", "open_index"]


@dataclass
class DedupSummary:
    read: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    dead_lettered: Counter[str] = field(default_factory=Counter)
    examples: list[tuple[str, str, int]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "read": self.read,
            "kept": self.kept,
            "dropped": dict(self.dropped),
            "dead_lettered": dict(self.dead_lettered),
            "examples": [{"id": i, "duplicate_of": m, "distance": d} for i, m, d in self.examples],
        }


def open_index(settings: Settings, path: Path) -> SegmentIndex:
    """The index the settings describe, at ``path``: the one place service and offline mode open it."""
    return SegmentIndex.from_settings(
        settings.index,
        bits=settings.fingerprint.width,
        payload_bytes=settings.dedup.sketch_size * 8,
        path=path,
        segments=settings.fingerprint.segments,
    )


def dedup_file(
    input_path: Path,
    output_path: Path,
    settings: Settings,
    *,
    work_dir: Path,
    dead_letter_path: Path | None = None,
    batch_size: int = 2048,
    progress: bool | None = None,
    max_examples: int = 5,
) -> DedupSummary:
    """Write the records of ``input_path`` that are not near-duplicates of earlier ones to ``output_path``."""
    # JSONL records carry their own id; Kafka's default (topic-partition-offset) has no meaning here.
    decoder = DocumentDecoder(settings.input.model_copy(update={"id_field": settings.input.id_field or "id"}))
    summary = DedupSummary()
    show_progress = sys.stderr.isatty() if progress is None else progress
    dead_letter_path = dead_letter_path or output_path.with_name(output_path.name + ".dead-letters.jsonl")
    with (
        open_index(settings, work_dir) as index,
        input_path.open("rb") as source,
        output_path.open("wb") as kept_out,
        dead_letter_path.open("wb") as dead_out,
        tqdm(total=input_path.stat().st_size, unit="B", unit_scale=True, disable=not show_progress) as bar,
    ):
        dedup = Deduplicator(settings, index)
        for lines in _batches(source, batch_size):
            decoded = [
                decoder.decode(line, default_id=f"line-{summary.read + n + 1}", timestamp=0.0)
                for n, line in enumerate(lines)
            ]
            summary.read += len(lines)
            documents = [(line, item) for line, item in zip(lines, decoded) if isinstance(item, Document)]
            verdicts = dedup.decide([doc for _, doc in documents])
            for (line, doc), verdict in zip(documents, verdicts):
                _record(summary, doc, verdict, max_examples)
                if verdict.novel:
                    kept_out.write(_with_newline(line))
            for line, item in zip(lines, decoded):
                if isinstance(item, DeadLetter):
                    summary.dead_lettered[item.reason] += 1
                    dead_out.write(_dead_letter_line(line, item))
            bar.update(sum(len(line) for line in lines))
    return summary


def _record(summary: DedupSummary, doc: Document, verdict: Verdict, max_examples: int) -> None:
    if verdict.novel:
        summary.kept += 1
        return
    summary.dropped[verdict.reason] += 1
    if len(summary.examples) < max_examples and verdict.match_id is not None:
        summary.examples.append((doc.id, verdict.match_id, verdict.distance or 0))


def _batches(source: BinaryIO, size: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for line in source:
        if not line.strip():
            continue
        batch.append(line)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _with_newline(line: bytes) -> bytes:
    return line if line.endswith(b"\n") else line + b"\n"


def _dead_letter_line(line: bytes, letter: DeadLetter) -> bytes:
    record = {"reason": letter.reason, "detail": letter.detail, "original": line.decode("utf-8", "replace").rstrip("\n")}
    return json.dumps(record, ensure_ascii=False).encode() + b"\n"
