"""The ``logicd plan`` command: arguments in, table / JSON / picture / values out; exit 2 on bad input."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import PlanError, as_json, example_plan, plan_file, render_svg, render_text, write_values

__all__ = ["add_parser", "command"]

DESCRIPTION = (
    "Size the services of PLAN.yaml for their peak and average traffic from capacity per pod (a configuration "
    "sweep's results or numbers by hand), pack the pods onto the node types on offer by their Kubernetes "
    "requests, and compare the options side by side in $/hour and $/1M requests: cpu-only (before a GPU move), "
    "monolith-per-gpu-node (the naive move), split-packed (logic and model apart, CPU pods on GPU nodes' spare "
    "CPUs), shared-model-service. Exit status: 0 planned, 2 bad input (the message names the service or field)."
)


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = commands.add_parser(
        "plan", help="capacity and cost planning: nodes, pod packing, $/hour", description=DESCRIPTION
    )
    p.add_argument("plan", nargs="?", type=Path, metavar="PLAN.yaml", help="the plan file (see --example)")
    p.add_argument("--example", action="store_true", help="print the example plan file and exit")
    p.add_argument("--json", action="store_true", help="print the plan as JSON instead of the table")
    p.add_argument("--summary", action="store_true", help="the options' table only, without replicas and nodes")
    p.add_argument("--picture", type=Path, metavar="FILE.svg", help="write the options' nodes and pods as an SVG")
    p.add_argument(
        "--write-values",
        type=Path,
        metavar="DIR",
        help="write DIR/<service>.yaml, helm/ml-service values of the split-packed option, per logic+model pair",
    )


def command(args: argparse.Namespace) -> int:
    if args.example:
        sys.stdout.write(example_plan())
        return 0
    if args.plan is None:
        print(
            "logicd plan: give PLAN.yaml (`logicd plan --example > plan.yaml` writes one to start from)",
            file=sys.stderr,
        )
        return 2
    if args.picture is not None and args.picture.suffix.lower() != ".svg":
        print(f"logicd plan: --picture writes SVG: name a .svg file, not {args.picture}", file=sys.stderr)
        return 2
    try:
        planned = plan_file(args.plan)
    except PlanError as exc:
        print(f"logicd plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(as_json(planned), indent=2))
    else:
        sys.stdout.write(render_text(planned, details=not args.summary))
    err = sys.stderr if args.json else sys.stdout
    if args.picture is not None:
        args.picture.parent.mkdir(parents=True, exist_ok=True)
        args.picture.write_text(render_svg(planned), encoding="utf-8")
        print(f"picture: {args.picture}", file=err)
    if args.write_values is not None:
        written, skipped = write_values(planned, args.write_values, args.plan.name)
        for path in written:
            print(f"values: {path}", file=err)
        for why in skipped:
            print(f"values not written for {why}", file=err)
    return 0
