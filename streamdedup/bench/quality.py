"""Near-duplicate quality against the peers, on the same labelled stream in one run.

Every system sees the stream in order and decides keep or drop per document, remembering only what it kept:

- ``streamdedup``: the offline mode end to end (``dedup_file``: the stream as a JSONL file in, the kept records
  out, a fresh ``SegmentIndex`` in a temporary folder, the next batches signed by ``dedup.workers`` worker
  processes meanwhile), configured by the settings given (``--config``), batches of ``dedup.batch_size``. The
  workers start once, before any clock, as every system's imports do;
- ``simhash``: the ``simhash`` package, ``Simhash(text)`` (its defaults) + ``SimhashIndex(k=3)``;
- ``minhash-0.5`` / ``minhash-0.8``: datasketch ``MinHashLSH`` at that threshold, ``MinHash(num_perm=128)``
  over character 5-grams of the normalised text (the project's Normalizer, default settings).

Every system runs ``--repeat`` times per split, in interleaved rounds, and its docs/s comes from its fastest
run (as ``timeit`` reports the best of several): the machines this runs on are shared, and one slow moment
should not decide a ratio. Every run must drop exactly the same documents.

Prints recall, loss and docs/s per split and system, by edit kind and language with ``--detail``, and
writes everything as JSON with ``--json PATH``.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from ..normalize import Normalizer
from ..offline import dedup_file, signer_pool
from ..quality.corpus import STREAM_FILE, BenchDoc, load_stream
from ..quality.evaluate import QualityReport, evaluate
from ..settings import NormalizeSettings, Settings
from ..signature import SignerPool

__all__ = ["PEERS", "PeerResult", "main", "run_peer", "streamdedup_drops"]

SPLITS = ("tune", "holdout")
MINHASH_SHINGLE = 5
MINHASH_PERMUTATIONS = 128
SIMHASH_K = 3


@dataclass(frozen=True, slots=True)
class PeerResult:
    name: str
    split: str
    seconds: float
    report: QualityReport

    @property
    def docs_per_second(self) -> float:
        return self.report.overall.documents / self.seconds if self.seconds > 0 else float("inf")

    def as_dict(self) -> dict[str, object]:
        return {
            "system": self.name,
            "split": self.split,
            "seconds": self.seconds,
            "docs_per_second": self.docs_per_second,
            **self.report.as_dict(),
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
        fingerprint = Simhash(doc.text)
        if index.get_near_dups(fingerprint):
            dropped[position] = True
        else:
            index.add(doc.id, fingerprint)
    return dropped


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


PEERS: dict[str, Callable[[Sequence[BenchDoc], Settings], np.ndarray]] = {
    "streamdedup": streamdedup_drops,
    "simhash": _simhash,
    "minhash-0.5": _minhash(0.5),
    "minhash-0.8": _minhash(0.8),
}


def run_peer(
    name: str,
    docs: Sequence[BenchDoc],
    settings: Settings,
    split: str = "",
    pool: SignerPool | None = None,
    *,
    repeat: int = 1,
) -> PeerResult:
    """Run one system over ``docs`` in order and score its decisions (``pool``: streamdedup's signing workers,
    started before the clock like every system's imports); with ``repeat``, the fastest of that many runs."""
    return _best([_timed_drops(name, docs, settings, pool) for _ in range(repeat)], name, docs, split)


def _timed_drops(
    name: str, docs: Sequence[BenchDoc], settings: Settings, pool: SignerPool | None
) -> tuple[float, np.ndarray]:
    if name == "streamdedup":
        return _timed_offline(docs, settings, pool)
    started = time.perf_counter()
    dropped = PEERS[name](docs, settings)
    return time.perf_counter() - started, dropped


def _best(runs: Sequence[tuple[float, np.ndarray]], name: str, docs: Sequence[BenchDoc], split: str) -> PeerResult:
    """The fastest run's time; the decisions, which every run must share."""
    first = runs[0][1]
    if any(not np.array_equal(dropped, first) for _, dropped in runs[1:]):
        raise RuntimeError(f"{name} dropped different documents in repeated runs over the same {split} stream")
    return PeerResult(name, split, min(seconds for seconds, _ in runs), evaluate(docs, first))


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.3f}%"


def _print_table(results: Sequence[PeerResult]) -> None:
    fastest_peer = {
        split: max((r.docs_per_second for r in results if r.split == split and r.name != "streamdedup"), default=None)
        for split in {r.split for r in results}
    }
    print(f"{'split':<8} {'system':<12} {'recall':>9} {'loss':>9} {'novel lost':>11} {'docs/s':>10} {'x fastest peer':>15}")
    for result in results:
        overall = result.report.overall
        fastest = fastest_peer[result.split]
        ratio = f"{result.docs_per_second / fastest:.1f}x" if fastest and result.name == "streamdedup" else ""
        print(
            f"{result.split:<8} {result.name:<12} {_percent(overall.recall):>9} {_percent(overall.loss):>9} "
            f"{overall.novel_dropped:>5}/{overall.novel:<5} {result.docs_per_second:>10.0f} {ratio:>15}"
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
    parser.add_argument("--stream", type=Path, default=STREAM_FILE, help="labelled stream (JSONL, xz)")
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

    stream = load_stream(args.stream)
    results = []
    with signer_pool(settings) as pool:
        if pool is not None:
            for ready in pool.warm_up():
                ready.result()  # every worker up, imported and with its tables built before any clock starts
        for split in SPLITS if args.split == "all" else (args.split,):
            docs = [doc for doc in stream if doc.split == split][: args.limit]
            runs: dict[str, list[tuple[float, np.ndarray]]] = {name: [] for name in systems}
            # Rounds interleave the systems, so a slow stretch of the machine falls on all of them alike.
            for round_number in range(1, args.repeat + 1):
                for name in systems:
                    runs[name].append(_timed_drops(name, docs, settings, pool))
                    seconds = runs[name][-1][0]
                    print(f"  {split} round {round_number} {name}: {len(docs)} docs in {seconds:.1f} s", flush=True)
            results.extend(_best(runs[name], name, docs, split) for name in systems)
    print()
    _print_table(results)
    if args.detail:
        _print_detail(results)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([result.as_dict() for result in results], indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {args.json}")
    return 0
