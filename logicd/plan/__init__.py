"""``logicd plan``: capacity and cost planning, from measured throughput per pod to nodes, pod packing and
dollars per hour, compared over deployment options, and back into helm/ml-service values.

The input is a plan file (``example_plan()`` is one: ``logicd plan --example``); ``plan_file`` reads it and
builds every option; ``render_text``, ``as_json`` and ``render_svg`` show the result; ``write_values`` writes
the chart's values. Bad input raises :class:`PlanError` naming the field or service and what to change.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ._options import KINDS, Option, Planned, plan_options
from ._render import as_json, render_text
from ._schema import Plan, PlanError, load_plan, parse_plan
from ._sensitivity import Sensitivity, sensitivity
from ._svg import render_svg
from ._values import values_for, write_values

__all__ = [
    "EXAMPLES",
    "KINDS",
    "OPTIONS",
    "Option",
    "Plan",
    "PlanError",
    "Planned",
    "Sensitivity",
    "as_json",
    "example_plan",
    "load_plan",
    "parse_plan",
    "plan_all",
    "plan_file",
    "render_svg",
    "render_text",
    "sensitivity",
    "values_for",
    "write_values",
]


OPTIONS = KINDS
"""The kinds of option every plan compares (built once per accelerator family where models give variants)."""

EXAMPLES = {
    "default": "example.yaml",
    "accelerators": "accelerators.yaml",
}
"""The example plans shipped with the package: ``logicd plan --example [NAME]``."""


def example_plan(name: str = "default") -> str:
    """An example plan file shipped with the package: ``default`` (one accelerated service beside five CPU
    services, on A10G), ``accelerators`` (T4 against Inferentia against CPU only, in one run)."""
    return resources.files(__package__).joinpath(EXAMPLES[name]).read_text(encoding="utf-8")


def plan_all(plan: Plan, base: Path, source: str = "plan", *, sensitive: bool = True) -> Planned:
    """Resolve capacities, build every option and (``sensitive``) the cost against traffic and throughput."""
    planned = plan_options(plan, base, source)
    if sensitive:
        planned.sensitivity = sensitivity(planned)
    return planned


def plan_file(path: Path, *, sensitive: bool = True) -> Planned:
    """Read the plan at ``path`` (sweep folders relative to it) and build every option."""
    return plan_all(load_plan(path), path.absolute().parent, str(path), sensitive=sensitive)
