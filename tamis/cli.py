"""`tamis serve | generate | quantize`.

Each subcommand lives in ``tamis/commands/<name>.py`` and exposes
``add_parser(subparsers)`` (registering its flags and ``set_defaults(func=run)``)
and ``run(args) -> int``. A subcommand whose module is missing or fails to import
is still listed, and says why when invoked, so one broken subpackage never hides the others.
Every subcommand module is imported to build the parser, so neither it nor its
``add_parser`` may import torch or another heavy module: ``tamis --help`` and a busy
``tamis serve`` port answer in a tenth of a second; ``run`` imports what it needs.
The benchmarks are scripts of a source checkout, run as ``python bench/bench_NAME.py``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = ("serve", "generate", "quantize")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tamis", description="tamis LLM serving engine")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"tamis.commands.{name}")
        except ImportError as exc:
            broken = subparsers.add_parser(name, help=f"(unavailable: {exc})")
            broken.set_defaults(func=_unavailable(name, exc))
            continue
        module.add_parser(subparsers)
    return parser


def _unavailable(name: str, exc: Exception):
    def run(_args: argparse.Namespace) -> int:
        print(f"tamis {name}: unavailable: {exc}", file=sys.stderr)
        return 2
    return run


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
