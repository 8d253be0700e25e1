"""``modelsvc`` command line. ``serve`` takes tritonserver's flag names, so manifests carry over.

Each command is a module with an ``add`` (its subparser) and a ``run`` (its exit status), listed in
:data:`COMMANDS`; a new command is a new module and one line there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .. import __version__
from . import _build, _compare, _serve, _tools
from ._tools import INT_DTYPES, KINDS, POOLINGS, TASKS
from ._types import port_number

__all__ = ["COMMANDS", "INT_DTYPES", "KINDS", "POOLINGS", "TASKS", "main", "port_number"]

if TYPE_CHECKING:
    _SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

#: command name -> (add its subparser, run it); in the order ``modelsvc --help`` lists them
COMMANDS: dict[str, tuple[Callable[[_SubParsers], None], Callable[[argparse.Namespace], int]]] = {
    "serve": (_serve.add, _serve.run),
    "stubgen": (_tools.add_stubgen, _tools.run_stubgen),
    "export": (_tools.add_export, _tools.run_export),
    "inspect": (_tools.add_inspect, _tools.run_inspect),
    "build": (_build.add, _build.run),
    "compare": (_compare.add, _compare.run),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelsvc", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--version", action="version", version=f"modelsvc {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for add, _ in COMMANDS.values():
        add(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return COMMANDS[args.command][1](args)


if __name__ == "__main__":
    sys.exit(main())
