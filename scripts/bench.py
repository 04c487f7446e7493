"""Thin wrapper: ``python scripts/bench.py [--steps N] [--models ...] [--csv FILE]``.

The same table as ``diffgym bench``; this entry point also takes ``--warmup``, ``--repeats`` and
``--csv`` (see ``diffgym/bench.py``).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from diffgym.bench import add_arguments, main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(add_arguments(argparse.ArgumentParser(prog="scripts/bench.py")).parse_args()))
