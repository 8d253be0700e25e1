"""``logicd plan``: capacity and cost planning, from measured throughput per pod to nodes, pod packing and
dollars per hour, compared over deployment options, and back into helm/ml-service values.

The input is a plan file (``example_plan()`` is one: ``logicd plan --example``); ``plan_file`` reads it and
builds every option; ``render_text``, ``as_json`` and ``render_svg`` show the result; ``write_values`` writes
the chart's values. Bad input raises :class:`PlanError` naming the field or service and what to change.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ._options import OPTIONS, Option, Planned, plan_all
from ._render import as_json, render_svg, render_text
from ._schema import Plan, PlanError, load_plan, parse_plan
from ._values import values_for, write_values

__all__ = [
    "OPTIONS",
    "Option",
    "Plan",
    "PlanError",
    "Planned",
    "as_json",
    "example_plan",
    "load_plan",
    "parse_plan",
    "plan_all",
    "plan_file",
    "render_svg",
    "render_text",
    "values_for",
    "write_values",
]


def example_plan() -> str:
    """The example plan file shipped with the package (one accelerated service, five CPU services)."""
    return resources.files(__package__).joinpath("example.yaml").read_text(encoding="utf-8")


def plan_file(path: Path) -> Planned:
    """Read the plan at ``path`` (sweep folders relative to it) and build every option."""
    return plan_all(load_plan(path), path.absolute().parent, str(path))
