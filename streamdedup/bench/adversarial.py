"""Streams built to make keys hot, against natural text of the same length: the rate and the candidates per
document must not depend on the content, and the real copies mixed in must still be caught.

- ``natural``: the first ``--documents`` documents of ``bench growth``'s corpus (this machine's Debian package
  texts), the rate to hold;
- ``template``: one template, ``"<name> is a Python library for <topic> and <word> <word>"``, with random
  names and words: every document shares the template's keys with every other, and none is a near copy of
  another (three words of about eleven differ);
- ``boilerplate``: one boilerplate sentence and one distinct number: near copies of one another, the stream
  a spammer or a templated notifier makes.

Into each, ``--copies`` (a fraction) of its documents are copied later in the stream, half as they were and
half with a word added, at random distances. Each stream goes through the offline mode as ``bench growth``
runs it (``run_growth``: the configured workers, a fresh index), in windows of ``--window`` documents.

Prints, per stream: documents/s and its ratio to the natural stream's, candidates per document (p50, p99,
max), the copies caught out of those planted, and the documents kept.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from ..settings import Settings
from ..verdicts import Verdicts
from .growth import Window, run_growth
from .growth_corpus import DEFAULT_CORPUS, ensure_corpus, read_corpus

__all__ = ["PlantedStream", "boilerplate_stream", "main", "plant_copies", "template_stream"]

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_TOPICS = ("parsing", "plotting", "testing", "caching", "logging", "the web", "numerics", "databases", "images")
BOILERPLATE = "please read the terms of service and the privacy notice carefully before you continue"


@dataclass(frozen=True, slots=True)
class PlantedStream:
    """Texts in stream order, and for each planted copy its position and its original's."""

    texts: list[str]
    copy_of: dict[int, int]


def template_stream(count: int, copies: float, seed: int = 0) -> PlantedStream:
    """``count`` texts of one template, with ``copies`` of them copied later (see the module docstring)."""
    rng = random.Random(seed)

    def word() -> str:
        return "".join(rng.choice(_LETTERS) for _ in range(rng.randint(6, 11)))

    texts = [f"{word()} is a Python library for {rng.choice(_TOPICS)} and {word()} {word()}" for _ in range(count)]
    return plant_copies(texts, copies, rng)


def boilerplate_stream(count: int, copies: float, seed: int = 0) -> PlantedStream:
    """``count`` texts of one sentence and a distinct number, with ``copies`` of them copied later."""
    rng = random.Random(seed)
    numbers = rng.sample(range(10**9), count)
    return plant_copies([f"{BOILERPLATE} {number:09d}" for number in numbers], copies, rng)


def plant_copies(texts: list[str], copies: float, rng: random.Random) -> PlantedStream:
    """``texts`` with ``round(copies * len(texts))`` copies of texts from their first half placed at random later
    positions, half of them with a word added."""
    originals = rng.sample(range(len(texts) // 2), round(copies * len(texts)))
    planted = [(rng.randint(original + 1, len(texts) - 1), original) for original in originals]
    # Copies go in after the text at their position; several at one position keep their drawing order.
    after: dict[int, list[int]] = {}
    for position, original in planted:
        after.setdefault(position, []).append(original)
    stream: list[str] = []
    copy_of: dict[int, int] = {}
    placed: dict[int, int] = {}
    for position, text in enumerate(texts):
        placed[position] = len(stream)
        stream.append(text)
        for original in after.get(position, []):
            copy_of[len(stream)] = placed[original]
            stream.append(texts[original] if rng.random() < 0.5 else texts[original] + " (fast)")
    return PlantedStream(stream, copy_of)


def main(options: list[str], settings: Settings) -> int:
    parser = argparse.ArgumentParser(prog="streamdedup bench adversarial", description=__doc__)
    parser.add_argument("--documents", type=int, default=200_000, help="documents per stream (default: 200,000)")
    parser.add_argument("--copies", type=float, default=0.01, help="share of documents copied later (default: 0.01)")
    parser.add_argument("--window", type=int, default=50_000, help="documents per window")
    parser.add_argument(
        "--corpus", type=Path, default=DEFAULT_CORPUS, help="bench growth's corpus; assembled if missing"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the streams")
    args = parser.parse_args(options)

    ensure_corpus(args.corpus, seed=args.seed)
    natural, _, _ = read_corpus(args.corpus, args.documents)
    streams: dict[str, tuple[list[bytes], PlantedStream | None]] = {"natural": (natural, None)}
    for name, make in (("template", template_stream), ("boilerplate", boilerplate_stream)):
        made = make(args.documents, args.copies, args.seed)
        streams[name] = (_lines(made.texts), made)

    results = []
    for name, (lines, planted) in streams.items():
        print(f"{name}: {len(lines):,} documents", flush=True)
        novel: list[np.ndarray] = []
        with tempfile.TemporaryDirectory(prefix=f"bench-adversarial-{name}-") as work:
            windows = run_growth(
                lines, settings, Path(work), window=args.window, report=_window_line, decided=_collect(novel)
            )
        results.append(_result(name, windows, np.concatenate(novel), planted))
    _print_table(results)
    return 0


def _lines(texts: list[str]) -> list[bytes]:
    return [orjson.dumps({"id": f"d{position}", "text": text}) for position, text in enumerate(texts)]


def _collect(novel: list[np.ndarray]) -> Callable[[Verdicts], None]:
    return lambda verdicts: novel.append(verdicts.novel)


def _window_line(window: Window) -> None:
    print(
        f"  window {window.number}: {window.docs_per_second:,.0f} documents/s, {window.entries:,} entries, "
        f"candidates p50 {window.candidates_p50:.0f} p99 {window.candidates_p99:.0f} max {window.candidates_max}",
        flush=True,
    )


@dataclass(frozen=True, slots=True)
class _Result:
    name: str
    documents: int
    docs_per_second: float
    candidates: tuple[float, float, int]
    caught: int | None
    planted: int | None
    kept: int


def _result(name: str, windows: list[Window], novel: np.ndarray, planted: PlantedStream | None) -> _Result:
    documents = sum(w.documents for w in windows)
    seconds = sum(w.seconds for w in windows)
    caught = None if planted is None else sum(not novel[copy] for copy in planted.copy_of)
    return _Result(
        name,
        documents,
        documents / seconds,
        (
            max(w.candidates_p50 for w in windows),
            max(w.candidates_p99 for w in windows),
            max(w.candidates_max for w in windows),
        ),
        caught,
        None if planted is None else len(planted.copy_of),
        int(novel.sum()),
    )


def _print_table(results: list[_Result]) -> None:
    normal = results[0].docs_per_second
    print(
        f"\n{'stream':<12} {'documents':>10} {'docs/s':>8} {'x natural':>9} {'cand p50':>8} {'cand p99':>8} "
        f"{'cand max':>8} {'copies caught':>14} {'kept':>9}"
    )
    for r in results:
        p50, p99, most = r.candidates
        caught = "-" if r.caught is None else f"{r.caught:,}/{r.planted:,}"
        print(
            f"{r.name:<12} {r.documents:>10,} {r.docs_per_second:>8,.0f} {r.docs_per_second / normal:>8.2f}x "
            f"{p50:>8.0f} {p99:>8.0f} {most:>8,} {caught:>14} {r.kept:>9,}"
        )
    print("candidates: the highest window's p50 and p99, and the maximum over the stream")
