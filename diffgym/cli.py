"""The ``diffgym`` command line: ``diffgym demo``, ``diffgym bench``, ... (each with --help)."""
from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    return run_demo(seconds=args.seconds)


def _bench(args: argparse.Namespace) -> int:
    from .bench import main as bench_main
    return bench_main(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="diffgym", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="simulate the shipped scenes and print what happened")
    p.add_argument("--seconds", type=float, default=2.0, help="simulated time per scene")
    p.set_defaults(func=_demo)
    p = sub.add_parser("bench", help="print the step-time benchmark table (MuJoCo side by side)")
    from .bench import add_arguments
    add_arguments(p)
    p.set_defaults(func=_bench)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
