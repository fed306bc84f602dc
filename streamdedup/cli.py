"""Command line: parse, load settings, configure logging, hand off. Nothing else lives here."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .bench import BENCHMARKS, LONG_BENCHMARKS
from .logs import configure_logging
from .settings import ConfigError, Settings, load_settings

__all__ = ["EXIT_FENCED", "main"]

# `streamdedup run` was replaced by a newer instance with its transactional id (see service.InstanceFenced).
EXIT_FENCED = 3


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "bench":
        # `bench kafka --log-level INFO`: the option may follow the benchmark's name too.
        named, args.options = _log_level_option().parse_known_args(args.options)
        args.log_level = named.log_level or args.log_level
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"streamdedup: {exc}", file=sys.stderr)
        return 2
    level = getattr(args, "log_level", None)
    if level is not None:
        settings = settings.model_copy(update={"logging": settings.logging.model_copy(update={"level": level})})
    configure_logging(settings, quiet=args.quiet if level is None else "")
    return int(args.handler(args, settings) or 0)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamdedup", description=__doc__)
    parser.add_argument("--version", action="version", version=f"streamdedup {__version__}")
    parser.add_argument("--config", default=None, help="YAML config file (default: built-in defaults)")
    # `streamdedup run --config x.yaml` reads as naturally as `streamdedup --config x.yaml run`: accept both.
    config_too = argparse.ArgumentParser(add_help=False)
    config_too.add_argument("--config", default=argparse.SUPPRESS, help="YAML config file")
    parser.set_defaults(quiet="")
    commands = parser.add_subparsers(dest="command", required=True)

    fingerprint = commands.add_parser(
        "fingerprint", parents=[config_too], help="print the hex fingerprint of a text or of each JSONL record"
    )
    fingerprint.add_argument("text", nargs="?", help="the text to fingerprint")
    fingerprint.add_argument("--file", help="JSONL file; one fingerprint per line")
    fingerprint.set_defaults(handler=_fingerprint)

    dedup = commands.add_parser(
        "dedup", parents=[config_too], help="deduplicate a JSONL file offline with the service's decision core"
    )
    dedup.add_argument("input", type=Path, help="JSONL input (one record per line)")
    dedup.add_argument("--output", type=Path, required=True, help="where the kept records go, unchanged and in order")
    dedup.add_argument("--work-dir", type=Path, default=None, help="index folder (default: a new folder under var/)")
    dedup.add_argument(
        "--dead-letters", type=Path, default=None, help="unreadable records (default: OUTPUT.dead-letters.jsonl)"
    )
    dedup.set_defaults(handler=_dedup)

    explain = commands.add_parser(
        "explain", parents=[config_too], help="show why two texts are or are not near-duplicates"
    )
    explain.add_argument("text_a")
    explain.add_argument("text_b")
    explain.set_defaults(handler=_explain)

    run = commands.add_parser("run", parents=[config_too], help="run the Kafka service until SIGTERM/SIGINT")
    run.set_defaults(handler=_run)

    replay = commands.add_parser(
        "replay",
        parents=[config_too],
        help="scaled out: decide the sequence topic again in the decider's calls and compare with what it stored",
    )
    replay.add_argument("--work-dir", type=Path, default=None, help="index folder (default: a new folder under var/)")
    replay.set_defaults(handler=_replay, quiet="libraries")

    demo = commands.add_parser(
        "demo",
        parents=[config_too, _log_level_option("the service's lines and warnings")],
        help="local broker + service + sample feed, then a summary",
    )
    demo.add_argument("--feed", type=Path, default=None, help="JSONL feed (default: the bundled sample feed)")
    demo.add_argument("--keep-broker", action="store_true", help="leave the local broker running afterwards")
    # The service's own lines narrate the demo; the Kafka client's group joins only bury its summary.
    demo.set_defaults(handler=_demo, quiet="libraries")

    index = commands.add_parser(
        "index",
        parents=[config_too],
        help="inspect or maintain a segment index (stats/query/export work while it is written)",
    )
    index.add_argument("action", choices=["stats", "query", "export", "import", "compact"])
    index.add_argument("path", type=Path, help="the index directory")
    index.add_argument("--fingerprint", action="append", default=[], help="query: a hex fingerprint (repeatable)")
    index.add_argument("--min-time", type=float, default=None, help="query: ignore entries older than this event time")
    index.add_argument("--input", type=Path, default=None, help="import: JSONL as written by export (default: stdin)")
    index.add_argument("--output", type=Path, default=None, help="export: JSONL file (default: stdout)")
    index.set_defaults(handler=_index)

    bench = commands.add_parser(
        "bench",
        parents=[config_too, _log_level_option("warnings only")],
        help="benchmarks against the peers, in one run",
    )
    bench.add_argument("name", choices=[*BENCHMARKS, *LONG_BENCHMARKS, "all"])
    bench.add_argument("options", nargs=argparse.REMAINDER, help="options for that benchmark")
    bench.set_defaults(handler=_bench, quiet="all")

    return parser


def _log_level_option(shown: str = "") -> argparse.ArgumentParser:
    """``--log-level``: every logger at this level, the libraries' too (bench and demo keep INFO lines out)."""
    option = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    option.add_argument(
        "--log-level",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        default=None,
        help=f"log at this level, the Kafka client's INFO lines included (default: {shown}; all of them when "
        "logging.level is DEBUG)",
    )
    return option


def _fingerprint(args: argparse.Namespace, settings: Settings) -> int:
    from .offline import fingerprint_command

    return fingerprint_command(args.text, args.file, settings)


def _dedup(args: argparse.Namespace, settings: Settings) -> int:
    from .offline import dedup_file

    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="dedup-", dir=_ensure_dir(Path("var"))))
    print(f"index: {work_dir}", file=sys.stderr)
    summary = dedup_file(args.input, args.output, settings, work_dir=work_dir, dead_letter_path=args.dead_letters)
    print(json.dumps(summary.as_dict(), ensure_ascii=False, indent=2))
    return 0


def _explain(args: argparse.Namespace, settings: Settings) -> int:
    from .explain import explain

    print("\n".join(explain(args.text_a, args.text_b, settings).lines()))
    return 0


def _ensure_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from .service import InstanceFenced, run_service

    try:
        asyncio.run(run_service(settings))
    except InstanceFenced:
        return EXIT_FENCED  # the service logged why; a traceback would add nothing
    return 0


def _replay(args: argparse.Namespace, settings: Settings) -> int:
    """Exit status 1 when the replay stores other documents than the decider did."""
    import asyncio

    from .replay import replay

    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="replay-", dir=_ensure_dir(Path("var"))))
    print(f"index: {work_dir}", file=sys.stderr)
    try:
        report = asyncio.run(replay(settings, work_dir))
    except ConfigError as exc:
        print(f"streamdedup: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), ensure_ascii=False, indent=2))
    return 1 if report.differ else 0


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from .demo import run_demo

    return run_demo(settings, feed=args.feed, keep_broker=args.keep_broker)


def _index(args: argparse.Namespace, settings: Settings) -> int:
    from .index.commands import run_index_command

    return run_index_command(
        args.action,
        args.path,
        settings,
        fingerprints=args.fingerprint,
        min_time=args.min_time,
        source=args.input,
        target=args.output,
    )


def _bench(args: argparse.Namespace, settings: Settings) -> int:
    from .bench import run_bench

    return run_bench(args.name, args.options, settings)
