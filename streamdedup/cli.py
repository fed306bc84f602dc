"""Command line: parse, load settings, configure logging, hand off. Nothing else lives here."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from . import __version__
from .settings import ConfigError, Settings, load_settings

__all__ = ["main"]

log = logging.getLogger("streamdedup")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"streamdedup: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.handler(args, settings) or 0)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamdedup", description=__doc__)
    parser.add_argument("--version", action="version", version=f"streamdedup {__version__}")
    parser.add_argument("--config", default=None, help="YAML config file (default: built-in defaults)")
    commands = parser.add_subparsers(dest="command", required=True)

    fingerprint = commands.add_parser("fingerprint", help="print the hex fingerprint of a text or of each JSONL record")
    fingerprint.add_argument("text", nargs="?", help="the text to fingerprint")
    fingerprint.add_argument("--file", help="JSONL file; one fingerprint per line")
    fingerprint.set_defaults(handler=_fingerprint)

    bench = commands.add_parser("bench", help="benchmarks against the peers, in one run")
    bench.add_argument("name", choices=["fingerprint", "index", "kafka", "quality", "all"])
    bench.add_argument("options", nargs=argparse.REMAINDER, help="options for that benchmark")
    bench.set_defaults(handler=_bench)

    return parser


def _fingerprint(args: argparse.Namespace, settings: Settings) -> int:
    raise NotImplementedError


def _bench(args: argparse.Namespace, settings: Settings) -> int:
    from .bench import run_bench

    return run_bench(args.name, args.options, settings)
