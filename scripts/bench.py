"""Thin wrapper: python scripts/bench.py [--steps N] [--models ...] == diffgym bench."""
import sys

from diffgym.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
