"""Capacity per pod: from a configuration sweep's results (``python -m loadtests.sweep -o DIR`` writes
``DIR/results.json``), or a number given by hand; checked against the service's latency budget.

logicd never imports loadtests: the sweep's output is read as a file. A row counts when it has a result with
requests and no errors; the capacity is the row with the highest inferences/s whose p99 is within the budget
(a tie goes to the lower p99), the rule the sweep itself chooses by.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._schema import Capacity, PlanError

__all__ = ["Measured", "resolve_capacity"]


@dataclass(frozen=True)
class Measured:
    """One half's capacity: requests/s per pod (service requests), and the latency measured there."""

    rps: float
    p50_ms: float | None
    p99_ms: float | None
    source: str
    """Where the number came from, for the report: ``by hand`` or ``sweep DIR: config at concurrency N``."""


def _rows(path: Path, where: str) -> tuple[Path, list[dict[str, Any]]]:
    file = path / "results.json" if path.is_dir() else path
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlanError(
            f"{where}.sweep: cannot read {file} ({exc.strerror}): run `python -m loadtests.sweep ... -o DIR` "
            "and give its DIR"
        ) from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlanError(f"{where}.sweep: {file} is not a sweep's results.json ({exc})") from exc
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise PlanError(f"{where}.sweep: {file} has no `rows`: not a sweep's results.json")
    return file, [r for r in rows if isinstance(r, dict)]


def _clean(row: dict[str, Any]) -> tuple[float, float, float] | None:
    """(inferences/s, p50, p99) of an error-free row with requests, else None."""
    result = row.get("result")
    if not isinstance(result, dict) or row.get("error") or result.get("errors") or not result.get("requests"):
        return None
    latency = result.get("latency_ms") or {}
    try:
        out = float(result["infer_per_s"]), float(latency["p50"]), float(latency["p99"])
    except (KeyError, TypeError, ValueError):
        return None
    return out if out[0] > 0 else None


def resolve_capacity(
    capacity: Capacity | None, where: str, budget_ms: float, base: Path, per_request: float = 1.0
) -> Measured:
    """The capacity of one half in service requests/s per pod; :class:`PlanError` when it is missing, unreadable
    or cannot meet ``budget_ms``. ``where`` names the half in messages (``services[0] (x).model``)."""
    how = "measure it with `python -m loadtests.sweep ... -o DIR` and give `sweep: DIR`, or give `rps` by hand"
    if capacity is None or (capacity.sweep is None and capacity.rps is None):
        raise PlanError(f"{where}.capacity: missing measurements: {how}")
    if capacity.sweep is not None and capacity.rps is not None:
        raise PlanError(f"{where}.capacity: give `sweep` or `rps`, not both")
    if capacity.rps is not None:
        if capacity.p99_ms is not None and capacity.p99_ms > budget_ms:
            raise PlanError(
                f"{where}.capacity.p99_ms: {capacity.p99_ms:g} ms is above the service's latency_budget_ms "
                f"{budget_ms:g}: raise the budget, or give the rate at which p99 is within it"
            )
        return Measured(capacity.rps / per_request, capacity.p50_ms, capacity.p99_ms, "by hand")
    path = Path(capacity.sweep or "")
    path = path if path.is_absolute() else base / path
    file, rows = _rows(path, where)
    clean = [(row, m) for row in rows if (m := _clean(row)) is not None]
    if not clean:
        raise PlanError(f"{where}.sweep: {file} holds no error-free measurement: run the sweep again")
    fits = [(row, m) for row, m in clean if m[2] <= budget_ms]
    if not fits:
        row, m = min(clean, key=lambda rm: rm[1][2])
        raise PlanError(
            f"{where}: latency_budget_ms {budget_ms:g} is below the smallest p99 the sweep measured "
            f"({m[2]:.2f} ms, {row.get('config')} at concurrency {row.get('concurrency')}): raise the budget "
            f"to at least {m[2]:.2f} ms, or sweep faster configurations (lower concurrency or queue delay)"
        )
    row, (ips, p50, p99) = max(fits, key=lambda rm: (rm[1][0], -rm[1][2]))
    source = f"sweep {file}: {row.get('config')} at concurrency {row.get('concurrency')} ({ips:,.1f} infer/s)"
    return Measured(ips / per_request, p50, p99, source)
