"""``PlanRunner``: a TensorRT plan run through the tensorrt backend's ``PlanEngine``.

``PlanEngine`` (``modelsvc.backends.tensorrt._tensorrt_engine``) owns everything that touches TensorRT and CUDA;
this module only adapts it to the ``Runner`` protocol, and imports it when a plan is opened, so that comparing ONNX
files and served models needs neither TensorRT nor a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ...protocol import CONFIG_TO_WIRE
from ._errors import RunnerFailed, SourceError
from ._types import Array, TensorDecl

__all__ = ["PlanRunner"]

ENGINE_MODULE = "modelsvc.backends.tensorrt._tensorrt_engine"
INSTALL_HINT = "pip install 'modelsvc[tensorrt]'"
#: top-level modules whose absence means the tensorrt extra is not installed
_EXTRA_MODULES = ("tensorrt", "cuda")


class PlanRunner:
    """A TensorRT plan (a file's path, or the plan's bytes) on GPU ``device`` with optimization ``profile``.

    ``opt_shapes`` holds the profile's opt shape of each input: ``modelsvc compare`` feeds those when no
    ``--shape`` is given, so that random inputs fall inside the profile.
    """

    def __init__(self, path_or_bytes: str | Path | bytes, device: int = 0, profile: int = 0) -> None:
        if isinstance(path_or_bytes, bytes):
            self.source = f"<plan of {len(path_or_bytes)} bytes>"
            plan = path_or_bytes
        else:
            self.source = str(path_or_bytes)
            try:
                plan = Path(path_or_bytes).read_bytes()
            except FileNotFoundError:
                raise SourceError(f"{self.source}: no such file") from None
            except OSError as exc:
                raise SourceError(f"{self.source}: cannot read it: {exc}") from None
        from ...backends import ModelLoadError

        try:
            from ...backends.tensorrt._tensorrt_engine import PlanEngine

            self._engine = PlanEngine(plan, device=device, profile=profile)
        except ImportError as exc:
            if (exc.name or "").split(".")[0] in _EXTRA_MODULES:
                raise SourceError(f"{self.source}: running a TensorRT plan needs TensorRT: {INSTALL_HINT}") from None
            raise
        except ModelLoadError as exc:  # not a plan, a plan of another TensorRT or GPU, no such profile
            raise SourceError(f"{self.source}: {exc}") from None
        except RuntimeError as exc:  # TensorRT's bindings and cudart raise it (no such GPU, out of memory)
            raise SourceError(f"{self.source}: cannot open the plan on GPU {device}: {exc}") from None
        description = self._engine.description
        self.inputs: list[TensorDecl] = [
            TensorDecl(t.name, _wire(self.source, t.name, t.datatype), tuple(t.dims))
            for t in description.tensors
            if t.is_input
        ]
        self.outputs: list[str] = [t.name for t in description.tensors if not t.is_input]
        profiles = description.profiles
        chosen = profiles[profile].shapes if 0 <= profile < len(profiles) else {}
        self.opt_shapes: dict[str, tuple[int, ...]] = {name: tuple(opt) for name, (_, opt, _) in chosen.items()}

    def run(self, feeds: Mapping[str, Array]) -> dict[str, Array]:
        try:
            outputs = self._engine.infer(feeds)
        except Exception as exc:  # the engine's own errors (a shape outside the profile, CUDA failures)
            raise RunnerFailed(f"{self.source}: TensorRT failed: {exc}") from None
        return {name: np.asarray(value) for name, value in outputs.items()}

    def close(self) -> None:
        self._engine.close()


def _wire(source: str, name: str, config_datatype: str) -> str:
    wire = CONFIG_TO_WIRE.get(config_datatype)
    if wire is None:
        raise SourceError(f"{source}: tensor {name!r} has datatype {config_datatype}, which compare cannot feed")
    return wire
