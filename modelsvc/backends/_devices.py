"""Which GPUs this process can see, found without initialising CUDA.

Initialising CUDA in the server's parent process would break any worker forked later, and
``onnxruntime.get_available_providers()`` lists CUDA whenever onnxruntime-gpu is installed, GPU or
not. So the count comes from the NVIDIA driver's files, filtered by ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from pathlib import Path

_DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")
_DEV = Path("/dev")
_DEV_GPU = re.compile(r"nvidia(\d+)")


def _driver_gpu_count() -> int:
    count = 0
    with contextlib.suppress(OSError):
        count = sum(1 for _ in _DRIVER_GPUS.iterdir())
    if count == 0:
        try:
            count = sum(1 for p in _DEV.iterdir() if _DEV_GPU.fullmatch(p.name))
        except OSError:
            count = 0
    return count


def _visible(count: int, env: str | None) -> tuple[int, ...]:
    if env is None:
        return tuple(range(count))
    entries = [e.strip() for e in env.split(",") if e.strip()]
    visible = 0
    for entry in entries:
        # CUDA stops at the first invalid entry; UUIDs and MIG names are taken as valid.
        if entry.lstrip("-").isdigit() and not 0 <= int(entry) < count:
            break
        visible += 1
    return tuple(range(min(visible, count)))


@functools.cache
def visible_gpus() -> tuple[int, ...]:
    """CUDA device ids (0..n-1) visible to this process; empty on a machine without NVIDIA GPUs."""
    return _visible(_driver_gpu_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))
