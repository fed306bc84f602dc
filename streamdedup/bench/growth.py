"""How the offline mode's cost grows with its index, on natural text.

The corpus (``growth_corpus``: descriptions, changelogs, copyright files, man pages and Python docstrings of
this machine's Debian packages, interleaved, ``--documents`` of them) goes through the offline mode as
``dedup_file`` runs it, with the settings given (``--config``): a fresh index in a temporary folder
(``open_index(durable=False)``), the configured signing workers, ``decide_lines`` over batches of
``dedup.batch_size``. Batches are cut at window edges, so each window of ``--window`` documents is timed from
the end of the previous one to the end of its last batch (the first from the moment every signing worker is up,
as ``bench quality`` starts its clocks), and the figures of its end are read outside its time.

Per window: documents/s, CPU time per document (this process and its workers: on a shared host it moves far
less than the rate), the decision step's own time per document (``Deduplicator.decide`` on the signed batches:
lookup, verification and store, the serial stage that bounds the rate, timed within the run while the workers
sign the next batches), the share kept, index
entries, resident memory of this process and its workers, index bytes on disk (LMDB pages in use) per kept
document, and how many documents each document's sketch was compared with (p50/p99/max,
``Deduplicator.last_candidates``). At the end: the last window's documents/s over the first's (goal: at least
0.8), the decision step's documents/s in the last window, a PNG chart of rate and candidates against index
entries, and with ``--json`` every figure.

Not in ``bench all``: the corpus and a million documents take minutes; run it by name.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import psutil

from ..decide import Deduplicator, open_index
from ..garbage import collecting_for_batches
from ..offline import decide_lines, signer_pool
from ..settings import Settings
from ..verdicts import Verdicts
from .growth_corpus import DEFAULT_CORPUS, SOURCES, ensure_corpus, read_corpus
from .host import CpuMeter

__all__ = ["GOAL", "Window", "main", "run_growth"]

# The last window's documents/s over the first's that the offline mode should keep as its index fills.
GOAL = 0.8


@dataclass(frozen=True, slots=True)
class Window:
    number: int
    documents: int
    seconds: float
    kept: int
    entries: int
    rss_bytes: int
    disk_bytes: int
    kept_so_far: int
    # CPU seconds of this process and its workers in the window: on a shared host it moves far less than the rate.
    cpu_seconds: float
    # Seconds the decision step took (``Deduplicator.decide`` on signed batches: lookup, verification, store).
    decide_seconds: float
    # Candidates per document over the window.
    candidates_p50: float
    candidates_p99: float
    candidates_max: int

    @property
    def docs_per_second(self) -> float:
        return self.documents / self.seconds if self.seconds > 0 else float("inf")

    @property
    def disk_per_kept(self) -> float:
        return self.disk_bytes / self.kept_so_far if self.kept_so_far else 0.0

    @property
    def cpu_per_document(self) -> float:
        return self.cpu_seconds / self.documents if self.documents else 0.0

    @property
    def decide_per_document(self) -> float:
        return self.decide_seconds / self.documents if self.documents else 0.0

    def as_dict(self) -> dict[str, object]:
        derived = {"docs_per_second": self.docs_per_second, "disk_per_kept": self.disk_per_kept}
        per_document = {"cpu_per_document": self.cpu_per_document, "decide_per_document": self.decide_per_document}
        return {**asdict(self), **derived, **per_document}


def main(options: list[str], settings: Settings) -> int:
    parser = argparse.ArgumentParser(prog="streamdedup bench growth", description=__doc__)
    parser.add_argument("--documents", type=int, default=1_000_000, help="documents to run (default: 1,000,000)")
    parser.add_argument("--window", type=int, default=100_000, help="documents per reported window")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="JSONL corpus; assembled here if missing")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffle that interleaves the sources")
    parser.add_argument("--chart", type=Path, default=Path("var/bench/growth.png"), help="PNG chart to write")
    parser.add_argument("--json", type=Path, default=None, help="write every figure as JSON here")
    parser.add_argument("--dir", type=Path, default=None, help="where the temporary index goes (default: the system's)")
    args = parser.parse_args(options)

    ensure_corpus(args.corpus, seed=args.seed)
    lines, counts, everything = read_corpus(args.corpus, args.documents)
    total = sum(everything.values())
    print(f"corpus {args.corpus}: {total:,} documents; running the first {len(lines):,}")
    if len(lines) < args.documents:
        print(f"  fewer than the {args.documents:,} asked for: this machine's packages hold no more (nothing repeated)")
    print("  in the corpus: " + _per_source(everything))
    print("  in this run:   " + _per_source(counts))
    print(
        f"offline mode: batches of {settings.dedup.batch_size:,}, {settings.dedup.workers} signing workers, "
        f"{settings.fingerprint.width}-bit fingerprints in {settings.fingerprint.segments} segments, "
        f"sketches of {settings.dedup.sketch_size}, min_jaccard {settings.dedup.min_jaccard}"
    )

    print(_HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-growth-", dir=args.dir) as work:
        windows = run_growth(
            lines, settings, Path(work), window=args.window, report=lambda w: print(_row(w), flush=True)
        )

    ratio = windows[-1].docs_per_second / windows[0].docs_per_second if windows else float("nan")
    print(f"last window / first window documents/s: {ratio:.2f} (goal >= {GOAL})")
    if windows and windows[-1].decide_per_document:
        print(
            "decision step (lookup, verification and store of signed batches, timed within the run), last window: "
            f"{1 / windows[-1].decide_per_document:,.0f} documents/s"
        )
    title = (
        f"bench growth: {len(lines):,} documents of natural text; "
        f"last / first window documents/s {ratio:.2f} (goal >= {GOAL})"
    )
    _chart(windows, args.chart, title=title)
    print(f"chart: {args.chart}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        figures = {
            "corpus": str(args.corpus),
            "corpus_documents": total,
            "documents": len(lines),
            "per_source": {source: counts[source] for source in SOURCES},
            "corpus_per_source": {source: everything[source] for source in SOURCES},
            "window": args.window,
            "windows": [w.as_dict() for w in windows],
            "ratio_last_first": ratio,
            "goal": GOAL,
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def _per_source(counts: Counter[str]) -> str:
    return ", ".join(f"{source} {counts[source]:,}" for source in SOURCES if counts[source])


def run_growth(
    lines: Sequence[bytes],
    settings: Settings,
    work: Path,
    *,
    window: int,
    report: Callable[[Window], None] = lambda w: None,
    decided: Callable[[Verdicts], None] = lambda v: None,
) -> list[Window]:
    """Run ``lines`` (JSONL records) through the offline mode in an index at ``work``; one :class:`Window` per
    ``window`` documents (the last may be shorter), each passed to ``report`` as it closes; each batch's
    verdicts to ``decided``, outside the clock."""
    # As dedup_file: JSONL records carry their own id.
    input_settings = settings.input.model_copy(update={"id_field": settings.input.id_field or "id"})
    windows: list[Window] = []
    me = psutil.Process()
    with (
        collecting_for_batches(),
        open_index(settings, work, durable=False) as index,
        signer_pool(settings, index.plan) as pool,
    ):
        dedup = Deduplicator(settings, index)
        if pool is not None:
            for ready in pool.warm_up():
                ready.result()  # every worker up, imported and with its tables built before the first window's clock
        batches = decide_lines(dedup, _batches(lines, settings.dedup.batch_size, window), input_settings, pool)
        read = kept = window_kept = 0
        candidates: list[np.ndarray] = []
        deciding = 0.0
        cpu = CpuMeter()
        cpu_before = 0.0
        started = time.perf_counter()
        for batch, _decoded, _docs, verdicts in batches:
            read += len(batch)
            novel = int(np.count_nonzero(verdicts.novel))
            kept += novel
            window_kept += novel
            candidates.append(dedup.last_candidates)
            timings = dedup.last_timings
            deciding += timings.fingerprint + timings.lookup + timings.store
            paused = time.perf_counter()
            decided(verdicts)
            started += time.perf_counter() - paused
            if read % window and read < len(lines):
                continue
            seconds = time.perf_counter() - started
            cpu_now = _cpu(cpu)
            usage = index.usage()
            closed = Window(
                number=len(windows) + 1,
                documents=read - sum(w.documents for w in windows),
                seconds=seconds,
                kept=window_kept,
                entries=usage["entries"],
                rss_bytes=_rss(me),
                disk_bytes=usage["disk_bytes"],
                kept_so_far=kept,
                cpu_seconds=cpu_now - cpu_before,
                decide_seconds=deciding,
                **_percentiles(candidates)._asdict(),
            )
            windows.append(closed)
            report(closed)
            window_kept = 0
            deciding = 0.0
            candidates = []
            cpu_before = _cpu(cpu)
            started = time.perf_counter()
    return windows


def _batches(lines: Sequence[bytes], size: int, window: int) -> Iterator[list[bytes]]:
    """Batches of ``size`` lines, cut short at each window's edge so that no batch spans two windows."""
    for start in range(0, len(lines), window):
        end = min(start + window, len(lines))
        for first in range(start, end, size):
            yield list(lines[first : min(first + size, end)])


def _cpu(meter: CpuMeter) -> float:
    return sum(value or 0.0 for value in meter.seconds().values())


def _rss(me: psutil.Process) -> int:
    """Resident bytes of this process and its children (the signing workers)."""
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class _Candidates(NamedTuple):
    candidates_p50: float
    candidates_p99: float
    candidates_max: int


def _percentiles(candidates: list[np.ndarray]) -> _Candidates:
    values = np.concatenate([np.zeros(0, dtype=np.int64), *candidates])
    if not len(values):
        return _Candidates(0.0, 0.0, 0)
    p50, p99 = np.percentile(values, [50, 99]).tolist()
    return _Candidates(p50, p99, int(values.max()))


_COLUMNS = (
    ("window", 6),
    ("documents/s", 11),
    ("CPU us/doc", 10),
    ("decide us/doc", 13),
    ("kept %", 6),
    ("index entries", 13),
    ("RSS MB", 7),
    ("disk B/kept doc", 15),
    ("cand p50", 8),
    ("cand p99", 8),
    ("cand max", 8),
)
_HEADER = "  ".join(name.rjust(width) for name, width in _COLUMNS)


def _row(w: Window) -> str:
    def candidates(value: float) -> str:
        return f"{value:,.0f}"

    cells = (
        str(w.number),
        f"{w.docs_per_second:,.0f}",
        f"{1e6 * w.cpu_per_document:,.0f}",
        f"{1e6 * w.decide_per_document:,.1f}",
        f"{100 * w.kept / w.documents:.1f}",
        f"{w.entries:,}",
        f"{w.rss_bytes / 2**20:,.0f}",
        f"{w.disk_per_kept:,.0f}",
        candidates(w.candidates_p50),
        candidates(w.candidates_p99),
        candidates(w.candidates_max),
    )
    return "  ".join(cell.rjust(width) for cell, (_, width) in zip(cells, _COLUMNS, strict=True))


def _chart(windows: Sequence[Window], path: Path, *, title: str) -> None:
    """Two panels against index entries: documents/s per window, and candidates per document (p50, p99)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    from matplotlib import pyplot as plt
    from matplotlib.ticker import FuncFormatter

    entries = [w.entries for w in windows]
    fig, (rate, compared) = plt.subplots(2, 1, figsize=(9, 7.5), sharex=True, constrained_layout=True)
    fig.suptitle(title)
    rate.plot(entries, [w.docs_per_second for w in windows], marker="o", label="documents/s in the window")
    if windows:
        rate.axhline(
            GOAL * windows[0].docs_per_second, color="grey", linestyle="--", label=f"goal: {GOAL} x the first window"
        )
    rate.set_ylabel("documents/s")
    rate.set_ylim(bottom=0)
    rate.grid(alpha=0.3)
    rate.legend(loc="lower left")
    compared.plot(entries, [w.candidates_p50 for w in windows], marker="o", label="p50")
    compared.plot(entries, [w.candidates_p99 for w in windows], marker="s", label="p99")
    compared.set_ylim(bottom=0)
    compared.legend(loc="lower right")
    compared.set_ylabel("candidates per document")
    compared.set_xlabel("index entries (kept documents stored)")
    compared.grid(alpha=0.3)
    thousands = FuncFormatter(lambda value, _: f"{value:,.0f}")
    rate.yaxis.set_major_formatter(thousands)
    compared.xaxis.set_major_formatter(thousands)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
