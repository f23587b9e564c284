"""`tamis bench NAME [ARGS...]`: runs ``bench/bench_NAME.py`` of a source checkout.

The benchmark scripts stay plain scripts (they run on the device machine from a bare
working tree); this command only finds them and forwards the remaining arguments.
"""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def available() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in BENCH_DIR.glob("bench_*.py"))


def add_parser(subparsers) -> None:
    names = available()
    parser = subparsers.add_parser(
        "bench", help="run a benchmark script from bench/",
        description=f"Benchmarks: {', '.join(names) or '(none: needs a source checkout)'}. "
                    "Arguments after NAME go to the script (try `tamis bench NAME --help`).")
    parser.add_argument("name", help="benchmark name, e.g. cpu_engine, offline, latency, structured")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    script = BENCH_DIR / f"bench_{args.name}.py"
    if not script.is_file():
        known = ", ".join(available()) or "none: tamis bench needs a source checkout with bench/"
        print(f"tamis bench: unknown benchmark {args.name!r} (known: {known})", file=sys.stderr)
        return 2
    sys.argv = [str(script), *args.args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0
