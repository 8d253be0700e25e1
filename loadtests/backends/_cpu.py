"""The CPU a backends run measures: the flags that decide what ``services.build --backend auto`` builds, its kind
among this project's three, and issue 31's int8 target for that kind.

Issue 31's targets, served, 512-token windows and the doc_classifier's long documents, against ONNX Runtime fp32 in
the same run: at least 4x on a CPU with AMX, 2.2x with AVX-512 VNNI, 1.3x on AVX2 (integer paths without VNNI).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["TARGETS", "cpu_kind", "flags_line", "int8_verdict", "read_flags"]

#: the flags shown in the header (those the runtimes' int8 and bf16 kernels choose by)
SHOWN = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
#: kind -> issue 31's int8 target (served, over ONNX Runtime fp32)
TARGETS = {"AMX": 4.0, "AVX-512 VNNI": 2.2, "AVX2": 1.3}


def read_flags(cpuinfo: str | None = None) -> set[str]:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_kind(flags: set[str]) -> str:
    """AMX, AVX-512 VNNI, AVX2 (this project's three kinds of CPU), or "other"."""
    if "amx_int8" in flags:
        return "AMX"
    if "avx512_vnni" in flags:
        return "AVX-512 VNNI"
    if "avx2" in flags:
        return "AVX2"
    return "other"


def flags_line(flags: set[str] | None = None) -> str:
    """``cpu flags: ...; kind ...`` for the header."""
    flags = read_flags() if flags is None else flags
    have = [f for f in SHOWN if f in flags]
    lacks = [f for f in SHOWN if f not in flags]
    kind = cpu_kind(flags)
    target = ""
    if kind in TARGETS:
        target = f" (issue 31's int8 target here: >= {TARGETS[kind]:g}x ONNX Runtime fp32, served)"
    return f"cpu flags: {' '.join(have) or '-'}; lacks {' '.join(lacks) or '-'}; kind: {kind}{target}"


def int8_verdict(results: Sequence[Any], flags: set[str] | None = None, tokens: int = 512) -> str:
    """Each calibrated int8 variant's served ratios on the ``tokens``-token cells and on the long documents,
    against this CPU kind's target (the medians over rounds)."""
    from loadtests.suite._rows import median

    kind = cpu_kind(read_flags() if flags is None else flags)
    target = TARGETS.get(kind)
    parts = []
    for r in results:
        if not r.variant.endswith("-int8") or not r.built or r.error:
            continue
        cells = {c: median(v) for c, v in r.ratios.get("served", {}).items() if c.endswith(f"x{tokens}")}
        pair = median(next(iter(r.ratios.get("pair", {}).values()), []))
        shown = [f"{c} {v:.2f}x" for c, v in cells.items() if v is not None]
        shown.append("long docs " + ("-" if pair is None else f"{pair:.2f}x"))
        figures = [v for v in [*cells.values(), pair] if v is not None]
        met = "" if target is None or not figures else (" met" if min(figures) >= target else " not met")
        parts.append(f"{r.variant} served {', '.join(shown)}{met}")
    head = f"issue 31 ({kind}" + (f", target >= {target:g}x)" if target else ", no target)")
    return f"{head}: " + ("; ".join(parts) if parts else "no calibrated int8 variant measured")
