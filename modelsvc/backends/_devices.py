"""Which GPUs this process can see, found without initialising CUDA; where a config's instances go.

Initialising CUDA in the server's parent process would break any worker forked later, and
``onnxruntime.get_available_providers()`` lists CUDA whenever onnxruntime-gpu is installed, GPU or
not. So the count comes from the NVIDIA driver's files, filtered by ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2

_KIND_AUTO = model_config_pb2.ModelInstanceGroup.KIND_AUTO
_KIND_GPU = model_config_pb2.ModelInstanceGroup.KIND_GPU
_KIND_CPU = model_config_pb2.ModelInstanceGroup.KIND_CPU

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


@dataclass(frozen=True, slots=True)
class Placement:
    """One instance an ``instance_group`` asks for."""

    group: str
    """The group's name (``<model>_<index>`` when it has none)."""
    number: int
    """The instance's number within its group, 0..total-1."""
    total: int
    """How many instances the group makes (count x GPUs)."""
    gpu: int | None
    """The CUDA device id; None for a CPU instance."""


def placements(config: Any, backend: str) -> list[Placement]:
    """Every instance ``config.instance_group`` asks for, as Triton places them: KIND_AUTO is GPU when one is
    visible, a GPU group makes ``count`` instances on each of its ``gpus`` (GPU 0 when it lists none), and a
    config with no group gets one KIND_AUTO instance. ValueError names a kind ``backend`` cannot run."""
    groups = list(config.instance_group)
    if not groups:  # a config that skipped the repository's defaults: Triton's default group
        groups = [model_config_pb2.ModelInstanceGroup(name=config.name, kind=_KIND_AUTO, count=1)]
    out: list[Placement] = []
    for index, group in enumerate(groups):
        name = group.name or f"{config.name}_{index}"
        kind = group.kind
        if kind == _KIND_AUTO:
            kind = _KIND_GPU if visible_gpus() else _KIND_CPU
        devices: list[int | None]
        if kind == _KIND_CPU:
            devices = [None]
        elif kind == _KIND_GPU:
            devices = list(group.gpus) or [0]
        else:
            raise ValueError(f"instance group '{name}': kind {group.kind} is not supported by {backend}")
        count = max(group.count, 1)
        total = count * len(devices)
        out += [Placement(name, number, total, devices[number // count]) for number in range(total)]
    return out
