"""Offline mode: deduplicate a JSONL file through the same decision core as the service.

Kept records are written unchanged (the original line bytes), in input order. Records that cannot be read
(bad JSON, no text, ...) are never dropped silently: they go to a dead-letter file with the reason.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np
from tqdm import tqdm

from .decide import Deduplicator, Verdicts
from .document import DeadLetter, Document, DocumentDecoder
from .index import IndexPlan, SegmentIndex, planned
from .settings import Settings
from .signature import Signatures, SignerPool

__all__ = ["DedupSummary", "decide_batches", "dedup_file", "index_plan", "open_index", "signer_pool"]

_Tag = TypeVar("_Tag")


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


def open_index(settings: Settings, path: Path, *, durable: bool = True) -> SegmentIndex:
    """The index the settings describe, at ``path``: the one place service and offline mode open it.

    ``durable=False`` skips the fsync per batch (``index.sync``) for a run that cannot resume after an OS
    crash anyway (the offline mode); the index is flushed once when it closes."""
    index_settings = settings.index if durable else settings.index.model_copy(update={"sync": False})
    return SegmentIndex.from_settings(
        index_settings,
        bits=settings.fingerprint.width,
        payload_bytes=settings.dedup.sketch_size * 8,
        path=path,
        segments=settings.fingerprint.segments,
    )


def index_plan(settings: Settings) -> IndexPlan:
    """The table plan of a new index under ``settings`` (an existing index keeps its own)."""
    return planned(settings.index, bits=settings.fingerprint.width, segments=settings.fingerprint.segments)


def signer_pool(settings: Settings, plan: IndexPlan | None = None) -> SignerPool | nullcontext[None]:
    """The configured signing processes, or nothing when ``dedup.workers`` is 0 (a context manager either way).
    They key batches under ``plan`` (the index's; default: ``index_plan(settings)``)."""
    workers = settings.dedup.workers
    if not workers:
        return nullcontext()
    return SignerPool(settings.fingerprint, settings.dedup, workers, plan or index_plan(settings))


def decide_batches(
    dedup: Deduplicator, batches: Iterable[tuple[_Tag, list[Document]]], pool: SignerPool | None
) -> Iterator[tuple[_Tag, list[Document], Verdicts]]:
    """Each (tag, batch) with the batch's verdicts, in order. With a pool, the batches after this one are
    read and signed in the workers while this one is decided, two ahead per worker: with one, a worker that
    shared the cores with deciding could still be signing the next batch when it was wanted."""
    ahead = 0 if pool is None else 2 * pool.workers
    pending: deque[tuple[_Tag, list[Document], Future[Signatures] | None]] = deque()
    for tag, docs in batches:
        pending.append((tag, docs, None if pool is None else pool.submit([doc.text for doc in docs])))
        if len(pending) > ahead:
            yield _decided(dedup, *pending.popleft())
    while pending:
        yield _decided(dedup, *pending.popleft())


def _decided(
    dedup: Deduplicator, tag: _Tag, docs: list[Document], signing: Future[Signatures] | None
) -> tuple[_Tag, list[Document], Verdicts]:
    return tag, docs, dedup.decide(docs, signatures=None if signing is None else signing.result())


def dedup_file(
    input_path: Path,
    output_path: Path,
    settings: Settings,
    *,
    work_dir: Path,
    dead_letter_path: Path | None = None,
    batch_size: int | None = None,
    progress: bool | None = None,
    max_examples: int = 5,
    signers: SignerPool | None = None,
) -> DedupSummary:
    """Write the records of ``input_path`` that are not near-duplicates of earlier ones to ``output_path``.

    Batches of ``batch_size`` records (default ``dedup.batch_size``); ``signers``: a running pool to sign with
    (left running), else the configured workers are started for this file."""
    batch_size = batch_size or settings.dedup.batch_size
    # JSONL records carry their own id; Kafka's default (topic-partition-offset) has no meaning here.
    decoder = DocumentDecoder(settings.input.model_copy(update={"id_field": settings.input.id_field or "id"}))
    summary = DedupSummary()
    show_progress = sys.stderr.isatty() if progress is None else progress
    dead_letter_path = dead_letter_path or output_path.with_name(output_path.name + ".dead-letters.jsonl")
    def documents(source: BinaryIO, dead_out: BinaryIO) -> Iterator[tuple[tuple[list[bytes], int], list[Document]]]:
        """Decoded batches tagged with their lines and byte count; dead letters are written as they are met
        (they never reach the decision core)."""
        for lines in _batches(source, batch_size):
            first = summary.read + 1
            decoded = decoder.decode_many(
                lines,
                default_ids=[f"line-{number}" for number in range(first, first + len(lines))],
                timestamps=[0.0] * len(lines),
            )
            summary.read += len(lines)
            kept_lines, docs = [], []
            for line, item in zip(lines, decoded, strict=True):
                if isinstance(item, Document):
                    kept_lines.append(line)
                    docs.append(item)
                else:
                    summary.dead_lettered[item.reason] += 1
                    dead_out.write(_dead_letter_line(line, item))
            yield (kept_lines, sum(map(len, lines))), docs

    with (
        open_index(settings, work_dir, durable=False) as index,
        nullcontext(signers) if signers is not None else signer_pool(settings, index.plan) as pool,
        input_path.open("rb") as source,
        output_path.open("wb") as kept_out,
        dead_letter_path.open("wb") as dead_out,
        tqdm(total=input_path.stat().st_size, unit="B", unit_scale=True, disable=not show_progress) as bar,
    ):
        batches = decide_batches(Deduplicator(settings, index), documents(source, dead_out), pool)
        for (lines, size), docs, verdicts in batches:
            _account(summary, docs, verdicts, max_examples)
            novel = verdicts.novel.tolist()
            kept_out.writelines(_with_newline(line) for line, kept in zip(lines, novel, strict=True) if kept)
            bar.update(size)
    return summary


def _account(summary: DedupSummary, docs: list[Document], verdicts: Verdicts, max_examples: int) -> None:
    """Count a decided batch from its verdicts' columns: a Python step per duplicate, none per kept document."""
    duplicates = np.flatnonzero(~verdicts.novel).tolist()
    summary.kept += len(docs) - len(duplicates)
    summary.dropped.update(verdicts.reasons[row] for row in duplicates)
    for row in duplicates[: max(0, max_examples - len(summary.examples))]:
        summary.examples.append((docs[row].id, verdicts.match_ids[row] or "", verdicts.distances[row] or 0))


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
