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
from itertools import islice
from pathlib import Path
from typing import BinaryIO, NamedTuple, TextIO

import numpy as np
from tqdm import tqdm

from .decide import Deduplicator, open_index
from .document import DeadLetter, Document, DocumentDecoder
from .fingerprint import Fingerprinter, fingerprint_hex
from .garbage import collecting_for_batches
from .index import IndexPlan, planned
from .settings import InputSettings, Settings
from .signature import Signatures, Signer, SignerPool
from .verdicts import Verdicts

__all__ = ["DedupSummary", "Example", "decide_lines", "dedup_file", "fingerprint_command", "index_plan", "signer_pool"]

_FINGERPRINT_BATCH = 1024  # records per batch in fingerprint_command


class Example(NamedTuple):
    """A dropped document and what decided it."""

    id: str
    duplicate_of: str
    reason: str
    jaccard: float | None
    distance: int


@dataclass
class DedupSummary:
    read: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    dead_lettered: Counter[str] = field(default_factory=Counter)
    examples: list[Example] = field(default_factory=list)
    # dedup.min_jaccard; None when dedup.verify is off (every candidate is then dropped).
    threshold: float | None = None
    # The estimated Jaccard of each dropped document with its match, by reason, a batch's array at a time.
    jaccards: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def jaccard_range(self) -> dict[str, dict[str, float]]:
        """Per reason, the least, median and greatest estimated Jaccard of the dropped documents."""
        ranges = {}
        for reason, parts in sorted(self.jaccards.items()):
            values = np.concatenate(parts)
            if len(values):
                low, median, high = np.quantile(values, [0.0, 0.5, 1.0]).tolist()
                ranges[reason] = {"min": round(low, 3), "median": round(median, 3), "max": round(high, 3)}
        return ranges

    def as_dict(self) -> dict[str, object]:
        return {
            "read": self.read,
            "kept": self.kept,
            "dropped": dict(self.dropped),
            "threshold": self.threshold,
            "dropped_jaccard": self.jaccard_range(),
            "dead_lettered": dict(self.dead_lettered),
            "examples": [
                {**example._asdict(), "jaccard": None if example.jaccard is None else round(example.jaccard, 3)}
                for example in self.examples
            ],
        }


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


def decide_lines(
    dedup: Deduplicator, batches: Iterable[list[bytes]], input_settings: InputSettings, pool: SignerPool | None
) -> Iterator[tuple[list[bytes], list[Document | DeadLetter], list[Document], Verdicts]]:
    """Each batch of JSONL lines, in order, with what each line decoded to, its documents (the lines that are
    not dead letters) and their verdicts (ids default to ``line-N``, counted from 1 over all batches). With a
    pool, the batches after this one are decoded and signed in the workers while this one is decided, two ahead
    per worker: with one, a worker that shared the cores with deciding could still be signing the next batch
    when it was wanted. Documents come back from the workers without their texts, which deciding does not
    read."""
    ahead = 0 if pool is None else 2 * pool.workers
    pending: deque[tuple[list[bytes], Future[_Read] | _Read]] = deque()
    first = 1
    for lines in batches:
        if pool is None:
            pending.append((lines, (_decoded(lines, input_settings, first), None)))
        else:
            pending.append((lines, pool.run(_decoded_and_signed, lines, input_settings, first)))
        first += len(lines)
        if len(pending) > ahead:
            yield _decided(dedup, *pending.popleft())
    while pending:
        yield _decided(dedup, *pending.popleft())


# A batch's lines as decoded, and their documents' signatures when signed in a worker.
_Read = tuple[list[Document | DeadLetter], Signatures | None]


def _decoded(lines: list[bytes], input_settings: InputSettings, first: int) -> list[Document | DeadLetter]:
    return DocumentDecoder(input_settings).decode_many(
        lines,
        default_ids=[f"line-{number}" for number in range(first, first + len(lines))],
        timestamps=[0.0] * len(lines),
    )


def _decoded_and_signed(signer: Signer, lines: list[bytes], input_settings: InputSettings, first: int) -> _Read:
    """In a signing worker: the lines decoded (documents without their texts) and their documents signed."""
    decoded = _decoded(lines, input_settings, first)
    signatures = signer.sign([item.text for item in decoded if type(item) is Document])
    return [item if isinstance(item, DeadLetter) else item._replace(text="") for item in decoded], signatures


def _decided(
    dedup: Deduplicator, lines: list[bytes], read: Future[_Read] | _Read
) -> tuple[list[bytes], list[Document | DeadLetter], list[Document], Verdicts]:
    decoded, signatures = read.result() if isinstance(read, Future) else read
    docs = [item for item in decoded if type(item) is Document]
    return lines, decoded, docs, dedup.decide(docs, signatures=signatures)


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
    (left running), else the configured workers are started for this file. The garbage collector runs as it does
    in the service's processes (``garbage.py``): a batch's documents and verdicts set off fewer collections."""
    batch_size = batch_size or settings.dedup.batch_size
    # JSONL records carry their own id; Kafka's default (topic-partition-offset) has no meaning here.
    input_settings = settings.input.model_copy(update={"id_field": settings.input.id_field or "id"})
    summary = DedupSummary(threshold=settings.dedup.min_jaccard if settings.dedup.verify else None)
    show_progress = sys.stderr.isatty() if progress is None else progress
    dead_letter_path = dead_letter_path or output_path.with_name(output_path.name + ".dead-letters.jsonl")
    with (
        collecting_for_batches(),
        open_index(settings, work_dir, durable=False) as index,
        nullcontext(signers) if signers is not None else signer_pool(settings, index.plan) as pool,
        input_path.open("rb") as source,
        output_path.open("wb") as kept_out,
        dead_letter_path.open("wb") as dead_out,
        tqdm(total=input_path.stat().st_size, unit="B", unit_scale=True, disable=not show_progress) as bar,
    ):
        batches = decide_lines(Deduplicator(settings, index), _batches(source, batch_size), input_settings, pool)
        for lines, decoded, docs, verdicts in batches:
            summary.read += len(lines)
            kept_lines = []
            for line, item in zip(lines, decoded, strict=True):
                if isinstance(item, Document):
                    kept_lines.append(line)
                else:
                    # Dead letters never reach the decision core.
                    summary.dead_lettered[item.reason] += 1
                    dead_out.write(_dead_letter_line(line, item))
            _account(summary, docs, verdicts, max_examples)
            novel = verdicts.novel.tolist()
            kept_out.writelines(_with_newline(line) for line, kept in zip(kept_lines, novel, strict=True) if kept)
            bar.update(sum(map(len, lines)))
    return summary


def _account(summary: DedupSummary, docs: list[Document], verdicts: Verdicts, max_examples: int) -> None:
    """Count a decided batch from its verdicts' columns: a Python step per duplicate, none per kept document."""
    duplicates = np.flatnonzero(~verdicts.novel).tolist()
    summary.kept += len(docs) - len(duplicates)
    reasons = [verdicts.reasons[row] for row in duplicates]
    summary.dropped.update(reasons)
    jaccards = np.array([verdicts.jaccards[row] for row in duplicates], dtype=np.float64)
    by_reason = np.array(reasons)
    for reason in set(reasons):
        summary.jaccards.setdefault(reason, []).append(jaccards[by_reason == reason])
    for row in duplicates[: max(0, max_examples - len(summary.examples))]:
        summary.examples.append(
            Example(
                docs[row].id,
                verdicts.match_ids[row] or "",
                verdicts.reasons[row],
                verdicts.jaccards[row],
                verdicts.distances[row] or 0,
            )
        )


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
    record = {
        "reason": letter.reason,
        "detail": letter.detail,
        "original": line.decode("utf-8", "replace").rstrip("\n"),
    }
    return json.dumps(record, ensure_ascii=False).encode() + b"\n"


def fingerprint_command(
    text: str | None,
    path: str | Path | None,
    settings: Settings,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """``streamdedup fingerprint``: the hex fingerprint of ``text``, or one line per record of the JSONL
    file ``path`` (records decoded as the service does; a record that cannot be fingerprinted prints ``-``
    and its reason goes to ``err``). Returns the exit status: 1 when some record failed, 2 on bad usage."""
    out = out or sys.stdout
    err = err or sys.stderr
    if text is not None and path is None:
        fingerprinter = Fingerprinter.from_settings(settings.fingerprint)
        print(fingerprint_hex(fingerprinter.fingerprint([text]))[0], file=out)
        return 0
    if path is None or text is not None:
        print("streamdedup fingerprint: give either a text or --file", file=err)
        return 2
    fingerprinter = Fingerprinter.from_settings(settings.fingerprint)
    decoder = DocumentDecoder(settings.input)
    failed = False
    with open(path, "rb") as lines:
        while batch := list(islice(lines, _FINGERPRINT_BATCH)):
            decoded = [decoder.decode(line.rstrip(b"\r\n"), default_id="", timestamp=0.0) for line in batch]
            texts = [each.text if isinstance(each, Document) else None for each in decoded]
            result = fingerprinter.fingerprint_batch(texts)
            for each, hex_value, error in zip(
                decoded, fingerprint_hex(result.fingerprints), result.errors, strict=True
            ):
                if isinstance(each, DeadLetter) or error is not None:
                    failed = True
                    reason = f"{each.reason}: {each.detail}" if isinstance(each, DeadLetter) else error
                    print(f"streamdedup fingerprint: record skipped: {reason}", file=err)
                    hex_value = "-"
                print(hex_value, file=out)
    return 1 if failed else 0
