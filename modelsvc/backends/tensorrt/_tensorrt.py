"""The TensorRT backend: Triton's ``tensorrt`` backend (platform ``tensorrt_plan``, file ``model.plan``).

Each instance is a ``PlanEngine`` (``_tensorrt_engine``: one execution context, one CUDA stream, pinned staging
buffers) on a GPU of its ``instance_group { kind: KIND_GPU gpus: [...] }``, on one optimization profile:
``instance_group.profile`` (Triton's field) lists the profiles its instances take in turn; without it, the
instances on one GPU take the engine's profiles in turn. TensorRT plans run only on GPUs: a ``KIND_CPU`` group
fails the load.

The config is completed from the engine as Triton does for plans and checked against it (``_tensorrt_spec``);
at request time an input shape outside the instance's profile is a 400 naming the tensor and the range, before
anything is copied to the GPU, and inputs that fit the profile one by one but not each other (TensorRT's
``infer_shapes`` raises) a 400 naming the inputs and their shapes in TensorRT's words. The engine class is
handed in by the registry's factory, which imports TensorRT and cuda-python only when a model asks for this
backend.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from modelsvc.protocol import InternalError, InvalidArgument, Unavailable

from .._base import Arrays, ModelConfig, ModelInstance, ModelLoadError
from .._devices import placements, visible_gpus
from .._shapes import InputsMismatch, shapes_of
from ._tensorrt_spec import (
    EngineDescription,
    InputShapesRejected,
    autocomplete_config,
    check_config,
    check_request_shapes,
    choose_profiles,
)

_KIND_GPU = 1  # model_config_pb2.ModelInstanceGroup.KIND_GPU


class Engine(Protocol):
    """What the backend needs of ``_tensorrt_engine.PlanEngine``."""

    description: EngineDescription

    def infer(
        self, feeds: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray[Any, Any]]: ...

    def close(self) -> None: ...


#: ``PlanEngine(plan, device=..., profile=...)``
EngineFactory = Callable[..., Engine]


class TensorRTInstance:
    """One plan engine on one GPU and one optimization profile."""

    def __init__(self, name: str, model: str, gpu: int, profile: int, engine: Engine) -> None:
        self.name = name
        self.device = f"gpu:{gpu}"
        self.providers = [f"TensorRT {engine.description.trt_version}", f"profile {profile}"]
        self.model = model
        self.profile = profile
        self._ranges = engine.description.profiles[profile]
        self._engine: Engine | None = engine
        self._lock = threading.Lock()

    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Arrays:
        """Check the shapes against the profile, run the engine; ``output_names`` empty means every output. Only the
        outputs asked for are copied from the GPU (the engine binds every output, copies back those)."""
        engine = self._engine
        if engine is None:
            raise Unavailable(f"model instance '{self.name}' is closed")
        check_request_shapes(self.model, self.profile, self._ranges, {k: v.shape for k, v in inputs.items()})
        try:
            with self._lock:
                return engine.infer(inputs, list(output_names))
        except InputShapesRejected as exc:
            raise InputsMismatch(shapes_of(inputs), f"TensorRT: {exc}", self.model) from exc
        except ValueError as exc:
            raise InvalidArgument(f"model '{self.model}': {exc}") from exc
        except RuntimeError as exc:
            raise InternalError(f"tensorrt error in instance '{self.name}': {exc}") from exc

    def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    def __repr__(self) -> str:
        return f"TensorRTInstance(name={self.name!r}, device={self.device!r}, providers={self.providers!r})"


def _first_gpu(config: ModelConfig) -> int:
    for group in config.instance_group:
        if group.kind == _KIND_GPU and len(group.gpus):
            return int(group.gpus[0])
    gpus = visible_gpus()
    return gpus[0] if gpus else 0


class TensorRTBackend:
    """Loads ``model.plan`` files into PlanEngines, one per model instance."""

    name = "tensorrt"

    def __init__(self, engine_factory: EngineFactory) -> None:
        self._engine_factory = engine_factory

    def _open(self, config: ModelConfig, artifact: Path, plan: bytes, gpu: int, profile: int) -> Engine:
        try:
            return self._engine_factory(plan, device=gpu, profile=profile)
        except ModelLoadError as exc:
            raise ModelLoadError(f"model '{config.name}' ('{artifact}', GPU {gpu}): {exc}") from exc
        except (RuntimeError, OSError) as exc:
            raise ModelLoadError(f"model '{config.name}': cannot open '{artifact}' on GPU {gpu}: {exc}") from exc

    @staticmethod
    def _read(config: ModelConfig, artifact: Path) -> bytes:
        if not artifact.is_file():
            raise ModelLoadError(f"unable to find '{artifact}' for model '{config.name}'")
        return artifact.read_bytes()

    def autocomplete(self, config: ModelConfig, artifact: Path) -> None:
        """Complete ``config`` from the engine (``_tensorrt_spec.autocomplete_config``) and check it."""
        plan = self._read(config, artifact)
        engine = self._open(config, artifact, plan, _first_gpu(config), 0)
        try:
            autocomplete_config(config, engine.description)
        finally:
            engine.close()

    def create_instances(self, config: ModelConfig, artifact: Path, version: int) -> list[ModelInstance]:
        """One PlanEngine per instance, on its GPU and optimization profile."""
        plan = self._read(config, artifact)
        try:
            where = placements(config, "tensorrt")
        except ValueError as exc:
            raise ModelLoadError(str(exc)) from None
        for place in where:
            if place.gpu is None:
                raise ModelLoadError(
                    f"instance group '{place.group}' of model '{config.name}' is KIND_CPU, but TensorRT plans run "
                    "only on GPUs: use kind: KIND_GPU (or KIND_AUTO on a machine with a GPU)"
                )
        probe: Engine | None = self._open(config, artifact, plan, int(where[0].gpu or 0), 0)
        assert probe is not None
        instances: list[ModelInstance] = []
        try:
            description = probe.description
            check_config(config, description)
            profiles = choose_profiles(config, where, len(description.profiles))
            for index, (place, profile) in enumerate(zip(where, profiles, strict=True)):
                gpu = int(place.gpu or 0)
                if index == 0 and profile == 0 and probe is not None:
                    engine, probe = probe, None
                else:
                    engine = self._open(config, artifact, plan, gpu, profile)
                name = place.group if place.total == 1 else f"{place.group}_{place.number}"
                instances.append(TensorRTInstance(name, config.name, gpu, profile, engine))
        except BaseException:
            for instance in instances:
                instance.close()
            raise
        finally:
            if probe is not None:
                probe.close()
        return instances
