"""``logicd`` command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="logicd", description="The logic-server framework.")
    parser.add_argument("--version", action="version", version=f"logicd {__version__}")
    parser.parse_args(argv)
    parser.print_help()
    return 0
