"""Near-duplicate quality against the peers, on the same labelled stream in one run.

Every system sees the stream in order and decides keep or drop per document, remembering only what it kept:

- ``streamdedup``: the offline mode end to end (``dedup_file``: the stream as a JSONL file in, the kept records
  out, a fresh ``SegmentIndex`` in a temporary folder, the next batches signed by ``dedup.workers`` worker
  processes meanwhile), configured by the settings given (``--config``), batches of ``dedup.batch_size``. The
  workers start before the clock, as every system's imports do;
- ``simhash``: the ``simhash`` package, ``Simhash(text)`` (its defaults) + ``SimhashIndex(k=3)``;
- ``minhash-0.5`` / ``minhash-0.8``: datasketch ``MinHashLSH`` at that threshold, ``MinHash(num_perm=128)``
  over character 5-grams of the normalised text (the project's Normalizer, default settings);
- ``rensa``: rensa's ``RMinHash`` (128 permutations) over the same 5-grams, every document of the split signed
  by its batched ``RMinHash.from_token_sets`` before the loop, ``RMinHashLSH(threshold=0.5, num_bands=16)``;
  each candidate is confirmed by the estimated Jaccard of the two sketches >= 0.5.

Splits: ``tune`` and ``holdout`` (edited copies of real texts, ``quality_stream.jsonl.xz``) and ``natural``
(Debian package descriptions and the duplicates they really hold, ``natural_stream.jsonl.xz``; see
:mod:`streamdedup.quality.natural`). Besides recall and loss (clearly novel lost), every system is scored on
the near-copies it published: kept documents with exact Jaccard >= 0.8 to an earlier kept document (over the
ground truth's shingles: 4-grams for natural, 3-grams for tune and holdout), as a share of the kept ones.

Every system runs ``--repeat`` times per split, in interleaved rounds, and its docs/s comes from its fastest
run (as ``timeit`` reports the best of several): the machines this runs on are shared, and one slow moment
should not decide a ratio. Every run must drop exactly the same documents. Each run has a fresh process of its
own, so the memory a system leaves behind (the allocator's heap after hundreds of thousands of Python objects)
does not slow the next; before the clock it imports, receives its split and warms up on the split's first
2,000 documents, as a process that has been running would be.

Prints recall, loss and docs/s per split and system, by edit kind and language with ``--detail``, and
writes everything as JSON with ``--json PATH``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import multiprocessing
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ..normalize import Normalizer
from ..offline import dedup_file, signer_pool
from ..quality.corpus import STREAM_FILE, BenchDoc, load_stream
from ..quality.evaluate import QualityReport, evaluate
from ..quality.natural import NATURAL_FILE, NATURAL_SPLIT, NearCopies, load_natural, near_copies, truth_sets
from ..settings import NormalizeSettings, Settings
from ..signature import SignerPool

__all__ = ["PEERS", "PeerResult", "main", "run_peer", "split_near_copies", "streamdedup_drops"]

SPLITS = ("tune", "holdout", NATURAL_SPLIT)
MINHASH_SHINGLE = 5
MINHASH_PERMUTATIONS = 128
SIMHASH_K = 3
RENSA_THRESHOLD = 0.5
RENSA_BANDS = 16
RENSA_SEED = 42
CORPUS_SHINGLE = 3  # the tune and holdout ground truth's shingles (quality.corpus)
# Goals on the natural split: (recall at least, clearly novel lost at most, near-copies published at most).
GOALS = {NATURAL_SPLIT: (0.99, 0.0002, 0.0005)}


@dataclass(frozen=True, slots=True)
class PeerResult:
    name: str
    split: str
    seconds: float
    report: QualityReport
    kept: int
    published: int | None = None  # kept near-copies of an earlier kept document (None: not scored)

    @property
    def docs_per_second(self) -> float:
        return self.report.overall.documents / self.seconds if self.seconds > 0 else float("inf")

    @property
    def published_rate(self) -> float | None:
        """Share of the kept documents that are near-copies of an earlier kept one."""
        return None if self.published is None or not self.kept else self.published / self.kept

    def as_dict(self) -> dict[str, object]:
        return {
            "system": self.name,
            "split": self.split,
            "seconds": self.seconds,
            "docs_per_second": self.docs_per_second,
            **self.report.as_dict(),
            "near_copies_published": {"count": self.published, "kept": self.kept, "rate": self.published_rate},
        }


def streamdedup_drops(docs: Sequence[BenchDoc], settings: Settings, pool: SignerPool | None = None) -> np.ndarray:
    """Drop decisions of the offline mode end to end (see ``_timed_offline``)."""
    return _timed_offline(docs, settings, pool)[1]


def _timed_offline(docs: Sequence[BenchDoc], settings: Settings, pool: SignerPool | None) -> tuple[float, np.ndarray]:
    """``dedup_file`` over the stream written as JSONL (``id``, ``text``) into a temporary folder, with a fresh
    index there; with ``pool``, its workers sign (else the configured workers are started here). Timed from
    reading the file to the kept records written and the index closed; writing the input and reading the kept
    ids back are not (the peers get the texts in memory)."""
    with tempfile.TemporaryDirectory(prefix="streamdedup-bench-quality-") as name:
        folder = Path(name)
        source, kept = folder / "stream.jsonl", folder / "kept.jsonl"
        with source.open("wb") as out:
            out.writelines(orjson.dumps({"id": doc.id, "text": doc.text}) + b"\n" for doc in docs)
        started = time.perf_counter()
        dedup_file(source, kept, settings, work_dir=folder / "index", progress=False, signers=pool)
        seconds = time.perf_counter() - started
        with kept.open("rb") as lines:
            kept_ids = {orjson.loads(line)["id"] for line in lines}
    return seconds, np.array([doc.id not in kept_ids for doc in docs], dtype=bool)


def _simhash(docs: Sequence[BenchDoc], settings: Settings) -> np.ndarray:
    # The peers are the optional "bench" extra: imported only when run.
    from simhash import Simhash, SimhashIndex

    # SimhashIndex logs its set-up and every large bucket it meets; the table is what matters here.
    logging.getLogger("simhash").setLevel(logging.ERROR)
    index = SimhashIndex([], k=SIMHASH_K)
    dropped = np.zeros(len(docs), dtype=bool)
    for position, doc in enumerate(docs):
        fingerprint = _simhash_of(Simhash, doc.text)
        if index.get_near_dups(fingerprint):
            dropped[position] = True
        else:
            index.add(doc.id, fingerprint)
    return dropped


def _simhash_of(simhash: Any, text: str) -> Any:
    """``Simhash(text)``. simhash 2.1 multiplies a uint8 bit array by a feature's count, which numpy 2 refuses
    over 255 (a long text repeating a 4-gram that often); a numpy count there gives the value the package means."""
    try:
        return simhash(text)
    except OverflowError:
        counts = Counter(simhash(0)._tokenize(text))
        return simhash({feature: np.int64(count) if count > 255 else count for feature, count in counts.items()})


def _minhash(threshold: float) -> Callable[[Sequence[BenchDoc], Settings], np.ndarray]:
    def run(docs: Sequence[BenchDoc], settings: Settings) -> np.ndarray:
        from datasketch import MinHash, MinHashLSH

        lsh = MinHashLSH(threshold=threshold, num_perm=MINHASH_PERMUTATIONS)
        dropped = np.zeros(len(docs), dtype=bool)
        normalized = Normalizer(NormalizeSettings()).normalize([doc.text for doc in docs])
        for position, (doc, text) in enumerate(zip(docs, normalized, strict=True)):
            sketch = MinHash(num_perm=MINHASH_PERMUTATIONS)
            count = max(1, len(text) - MINHASH_SHINGLE + 1)
            sketch.update_batch([text[i : i + MINHASH_SHINGLE].encode("utf-8") for i in range(count)])
            if lsh.query(sketch):
                dropped[position] = True
            else:
                lsh.insert(doc.id, sketch)
        return dropped

    return run


def _rensa(docs: Sequence[BenchDoc], settings: Settings) -> np.ndarray:
    from rensa import RMinHash, RMinHashLSH

    normalized = Normalizer(NormalizeSettings()).normalize([doc.text for doc in docs])
    grams = [
        [text[i : i + MINHASH_SHINGLE] for i in range(max(1, len(text) - MINHASH_SHINGLE + 1))] for text in normalized
    ]
    # rensa signs a whole batch in one call; the stream's decisions still go one document at a time.
    sketches = RMinHash.from_token_sets(grams, MINHASH_PERMUTATIONS, RENSA_SEED)
    lsh = RMinHashLSH(threshold=RENSA_THRESHOLD, num_perm=MINHASH_PERMUTATIONS, num_bands=RENSA_BANDS)
    dropped = np.zeros(len(docs), dtype=bool)
    for position, sketch in enumerate(sketches):
        if any(sketch.jaccard(sketches[key]) >= RENSA_THRESHOLD for key in lsh.query(sketch)):
            dropped[position] = True
        else:
            lsh.insert(position, sketch)
    return dropped


PEERS: dict[str, Callable[[Sequence[BenchDoc], Settings], np.ndarray]] = {
    "streamdedup": streamdedup_drops,
    "simhash": _simhash,
    "minhash-0.5": _minhash(0.5),
    "minhash-0.8": _minhash(0.8),
    "rensa": _rensa,
}


_WARM_UP_DOCUMENTS = 2_000

_PEER_MODULES = {"simhash": "simhash", "minhash-0.5": "datasketch", "minhash-0.8": "datasketch", "rensa": "rensa"}


def _import_peer(name: str) -> None:
    """Import a peer's module now, before any clock."""
    if name in _PEER_MODULES:
        importlib.import_module(_PEER_MODULES[name])


def run_peer(
    name: str,
    docs: Sequence[BenchDoc],
    settings: Settings,
    split: str = "",
    pool: SignerPool | None = None,
    *,
    repeat: int = 1,
    near: NearCopies | None = None,
) -> PeerResult:
    """Run one system over ``docs`` in order and score its decisions (``pool``: streamdedup's signing workers,
    started before the clock like every system's imports); with ``repeat``, the fastest of that many runs;
    with ``near`` (the stream's near-copies), also the near-copies it published."""
    return _best([_timed_drops(name, docs, settings, pool) for _ in range(repeat)], name, docs, split, near)


def _timed_drops(
    name: str, docs: Sequence[BenchDoc], settings: Settings, pool: SignerPool | None
) -> tuple[float, np.ndarray]:
    if name == "streamdedup":
        return _timed_offline(docs, settings, pool)
    started = time.perf_counter()
    dropped = PEERS[name](docs, settings)
    return time.perf_counter() - started, dropped


def _timed_in_child(name: str, docs: Sequence[BenchDoc], settings: Settings) -> tuple[float, np.ndarray]:
    """One timed run of a system in a fresh process (streamdedup with its own signing workers, started and warmed
    up before the clock). Spawned, not forked: a fork of a process with threads can inherit a held lock."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child_run, args=(sender, name, docs, settings), name=f"bench-{name}")
    child.start()
    sender.close()
    try:
        outcome = receiver.recv()
    except EOFError:
        outcome = None
    child.join()
    if not isinstance(outcome, tuple):
        raise RuntimeError(f"{name} failed in its bench process (exit code {child.exitcode}): {outcome}")
    return outcome


def _child_run(sender: Any, name: str, docs: Sequence[BenchDoc], settings: Settings) -> None:
    try:
        _import_peer(name)
        with signer_pool(settings) if name == "streamdedup" else nullcontext() as pool:
            if pool is not None:
                for ready in pool.warm_up():
                    ready.result()  # every worker up, with its tables built
            _timed_drops(name, docs[:_WARM_UP_DOCUMENTS], settings, pool)
            outcome: tuple[float, np.ndarray] | str = _timed_drops(name, docs, settings, pool)
    except Exception as exc:  # the parent reports it, with the system's name
        outcome = f"{type(exc).__name__}: {exc}"
    sender.send(outcome)
    sender.close()


def _best(
    runs: Sequence[tuple[float, np.ndarray]],
    name: str,
    docs: Sequence[BenchDoc],
    split: str,
    near: NearCopies | None = None,
) -> PeerResult:
    """The fastest run's time; the decisions, which every run must share."""
    first = runs[0][1]
    if any(not np.array_equal(dropped, first) for _, dropped in runs[1:]):
        raise RuntimeError(f"{name} dropped different documents in repeated runs over the same {split} stream")
    published = None if near is None else int(near.published(first).sum())
    kept = int(len(docs) - first.sum())
    return PeerResult(name, split, min(seconds for seconds, _ in runs), evaluate(docs, first), kept, published)


def split_near_copies(docs: Sequence[BenchDoc]) -> NearCopies:
    """The near-copies of a tune or holdout stream, over its ground truth's shingles (exact join at 0.8)."""
    return near_copies(truth_sets([doc.text for doc in docs], CORPUS_SHINGLE))


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.3f}%"


def _print_table(results: Sequence[PeerResult]) -> None:
    fastest_peer = {
        split: max((r.docs_per_second for r in results if r.split == split and r.name != "streamdedup"), default=None)
        for split in {r.split for r in results}
    }
    print(
        f"{'split':<8} {'system':<12} {'recall':>9} {'loss':>9} {'novel lost':>13} {'near-copies published':>24} "
        f"{'docs/s':>10} {'x fastest peer':>15}"
    )
    for result in results:
        overall = result.report.overall
        fastest = fastest_peer[result.split]
        ratio = f"{result.docs_per_second / fastest:.1f}x" if fastest and result.name == "streamdedup" else ""
        published = "-" if result.published is None else f"{result.published}/{result.kept}"
        print(
            f"{result.split:<8} {result.name:<12} {_percent(overall.recall):>9} {_percent(overall.loss):>9} "
            f"{overall.novel_dropped:>6}/{overall.novel:<6} {_percent(result.published_rate):>9} {published:>14} "
            f"{result.docs_per_second:>10.0f} {ratio:>15}"
        )
    for split in dict.fromkeys(result.split for result in results):
        if split in GOALS:
            goal_recall, goal_lost, goal_published = GOALS[split]
            print(
                f"{split:<8} {'goal':<12} {'>=' + _percent(goal_recall):>9} {'<=' + _percent(goal_lost):>9} {'':>13} "
                f"{'<=' + _percent(goal_published):>9}"
            )


def _print_detail(results: Sequence[PeerResult]) -> None:
    for split in dict.fromkeys(result.split for result in results):
        chosen = [result for result in results if result.split == split]
        for title, groups in (("edit", "by_edit"), ("language", "by_lang")):
            keys = list(getattr(chosen[0].report, groups))
            print(f"\n{split}: recall / loss by {title}")
            print(f"{title:<22}" + "".join(f"{result.name:>24}" for result in chosen))
            for key in keys:
                cells = []
                for result in chosen:
                    rates = getattr(result.report, groups)[key]
                    cells.append(f"{_percent(rates.recall)} / {_percent(rates.loss)}")
                print(f"{key:<22}" + "".join(f"{cell:>24}" for cell in cells))


def main(options: list[str], settings: Settings) -> int:
    parser = argparse.ArgumentParser(prog="streamdedup bench quality", description=__doc__)
    parser.add_argument("--split", choices=[*SPLITS, "all"], default="all", help="which split to run")
    parser.add_argument("--limit", type=int, default=None, help="only the first N documents of each split")
    parser.add_argument("--systems", default=",".join(PEERS), help=f"comma-separated subset of {', '.join(PEERS)}")
    parser.add_argument("--stream", type=Path, default=STREAM_FILE, help="labelled tune/holdout stream (JSONL, xz)")
    parser.add_argument("--natural", type=Path, default=NATURAL_FILE, help="labelled natural split (JSONL, xz)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here as JSON")
    parser.add_argument("--detail", action="store_true", help="also print recall / loss by edit kind and language")
    parser.add_argument("--repeat", type=int, default=3, help="runs per system and split; docs/s of the fastest")
    args = parser.parse_args(options)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    systems = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = [name for name in systems if name not in PEERS]
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {list(PEERS)}")

    splits = SPLITS if args.split == "all" else (args.split,)
    stream = load_stream(args.stream) if set(splits) - {NATURAL_SPLIT} else []
    natural = load_natural(args.natural) if NATURAL_SPLIT in splits else None
    results: list[PeerResult] = []
    for split in splits:
        if natural is not None and split == NATURAL_SPLIT:
            docs = natural[0][: args.limit]
            near = natural[1].head(len(docs))
        else:
            docs = [doc for doc in stream if doc.split == split][: args.limit]
            near = split_near_copies(docs)
        runs: dict[str, list[tuple[float, np.ndarray]]] = {name: [] for name in systems}
        # Rounds interleave the systems, so a slow stretch of the machine falls on all of them alike.
        for round_number in range(1, args.repeat + 1):
            for name in systems:
                runs[name].append(_timed_in_child(name, docs, settings))
                seconds = runs[name][-1][0]
                print(f"  {split} round {round_number} {name}: {len(docs)} docs in {seconds:.1f} s", flush=True)
        results.extend(_best(runs[name], name, docs, split, near) for name in systems)
    print()
    _print_table(results)
    if args.detail:
        _print_detail(results)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([result.as_dict() for result in results], indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {args.json}")
    return 0
