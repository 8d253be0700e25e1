"""Model warmup: run a version's ``model_warmup`` samples before the version is published as ready.

Each ``model_warmup`` entry of ``config.pbtxt`` describes one sample request: its ``batch_size``, and for
each input a ``data_type``, ``dims`` (without the batch dimension) and where the data comes from:

- ``zero_data``: zeros (empty strings for TYPE_STRING);
- ``random_data``: uniform numbers in [0, 1) for floating types, integers in [0, 64) for integer types
  (small enough to be valid token ids and indices), random booleans; TYPE_STRING falls back to zeros,
  as in Triton;
- ``input_data_file``: raw row-major bytes read from ``<model>/warmup/<file>`` (Triton's place: a
  ``warmup`` folder in the model directory); TYPE_STRING elements as 4-byte little-endian lengths
  followed by their bytes.

A batching model gets the sample's tensors with a batch dimension of ``batch_size`` (the sample
repeated); a model without batching takes ``batch_size`` 1 only. Every sample runs ``count`` times (at
least once) on each instance: the runs go one after the other through the version's scheduler, which
hands each to the next free instance in turn. As in Triton, warmup runs count in the version's
statistics (Triton sends ``batch_size`` one-row requests as one batch, so its request counts (success,
queue, compute) grow by ``batch_size`` per run where modelsvc's grow by one; inference and execution
counts and batch statistics agree). A sample
that cannot be built or whose run fails fails the load of the version, naming the sample.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from ..backends import ModelConfig, ModelLoadError
from ..protocol import CONFIG_TO_WIRE, ModelsvcError, deserialize_bytes_tensor, numpy_dtype
from ..scheduler import Scheduler, WorkItem
from ._spec import TensorSpec

Arrays = dict[str, np.ndarray[Any, Any]]
logger = logging.getLogger("modelsvc.warmup")

WARMUP_FOLDER = "warmup"
"""Where ``input_data_file`` names are looked up, inside the model directory."""

_RANDOM_INT_HIGH = 64


def build_samples(config: ModelConfig, model_dir: Path, inputs: dict[str, TensorSpec]) -> list[tuple[str, Arrays, int]]:
    """Every warmup sample of ``config`` as (name, input tensors as the scheduler takes them, runs).

    ModelLoadError names the sample and the input when a sample does not fit the model.
    """
    samples = []
    rng = np.random.default_rng(0)
    batching = config.max_batch_size > 0
    for index, entry in enumerate(config.model_warmup):
        label = f"warmup sample '{entry.name}'" if entry.name else f"warmup sample {index}"
        batch = int(entry.batch_size)
        if batch < 1:
            raise ModelLoadError(f"{label}: batch_size must be at least 1, got {batch}")
        if not batching and batch != 1:
            raise ModelLoadError(f"{label}: batch_size must be 1 for a model without batching, got {batch}")
        if batching and batch > config.max_batch_size:
            raise ModelLoadError(f"{label}: batch_size {batch} is over max_batch_size {config.max_batch_size}")
        arrays: Arrays = {}
        for input_name, spec_in in entry.inputs.items():
            spec = inputs.get(input_name)
            if spec is None:
                raise ModelLoadError(f"{label}: the model has no input '{input_name}' (inputs: {', '.join(inputs)})")
            arrays[input_name] = _input(label, input_name, spec_in, spec, model_dir, rng, batch if batching else None)
        missing = [n for n, s in inputs.items() if n not in arrays and not s.optional]
        if missing:
            raise ModelLoadError(f"{label}: gives no data for the model's required input(s) {missing}")
        samples.append((label, arrays, max(int(entry.count), 1)))
    return samples


def _input(
    label: str,
    name: str,
    entry: Any,
    spec: TensorSpec,
    model_dir: Path,
    rng: np.random.Generator,
    batch: int | None,
) -> np.ndarray[Any, Any]:
    where = f"{label}, input '{name}'"
    type_name = model_config_pb2.DataType.Name(entry.data_type)
    datatype = CONFIG_TO_WIRE.get(type_name, type_name)
    if datatype != spec.datatype:
        raise ModelLoadError(f"{where}: data_type is {datatype}, the model takes {spec.datatype}")
    dims = tuple(int(d) for d in entry.dims)
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"{where}: dims {list(dims)} must be fixed (no -1) in a warmup sample")
    expected = spec.dims if spec.reshape is None else None
    if expected is not None and (
        len(dims) != len(expected) or any(e not in (-1, d) for d, e in zip(dims, expected, strict=True))
    ):
        raise ModelLoadError(f"{where}: dims {list(dims)} do not fit the model's dims {list(expected)}")
    count = int(np.prod(dims, dtype=np.int64))
    source = entry.WhichOneof("input_data_type")
    if source == "input_data_file":
        data = _from_file(where, model_dir, str(entry.input_data_file), datatype, count)
    elif source == "random_data" and datatype != "BYTES":
        data = _random(datatype, count, rng)
    elif source in ("zero_data", "random_data"):
        data = np.full(count, b"", dtype=np.object_) if datatype == "BYTES" else np.zeros(count, numpy_dtype(datatype))
    else:
        raise ModelLoadError(f"{where}: says neither zero_data, random_data nor input_data_file")
    data = data.reshape(dims)
    if spec.reshape is not None:
        data = data.reshape(spec.reshape)
    if batch is not None:
        data = np.repeat(data[np.newaxis, ...], batch, axis=0)
    return data


def _random(datatype: str, count: int, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    dtype = numpy_dtype(datatype)
    if datatype == "BOOL":
        return rng.integers(0, 2, count).astype(np.bool_)
    if datatype.startswith(("INT", "UINT")):
        return rng.integers(0, _RANDOM_INT_HIGH, count).astype(dtype)
    return rng.random(count).astype(dtype)


def _from_file(where: str, model_dir: Path, name: str, datatype: str, count: int) -> np.ndarray[Any, Any]:
    folder = (model_dir / WARMUP_FOLDER).resolve()
    path = (folder / name).resolve()
    if not path.is_relative_to(folder):
        raise ModelLoadError(f"{where}: input_data_file '{name}' is outside the model's {WARMUP_FOLDER}/ folder")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"{where}: cannot read input_data_file {path}: {exc.strerror or exc}") from exc
    if datatype == "BYTES":
        try:
            return deserialize_bytes_tensor(raw, count, f"{where}: input_data_file '{name}'")
        except ModelsvcError as exc:
            raise ModelLoadError(exc.message) from exc
    dtype = numpy_dtype(datatype)
    if len(raw) != count * dtype.itemsize:
        raise ModelLoadError(
            f"{where}: input_data_file '{name}' has {len(raw)} bytes, the dims need {count * dtype.itemsize} "
            f"({count} x {datatype})"
        )
    return np.frombuffer(raw, dtype=dtype).copy()


async def warm_up(
    label: str,
    config: ModelConfig,
    model_dir: Path,
    target: Scheduler,
    inputs: dict[str, TensorSpec],
    outputs: list[str],
    instances: int,
) -> None:
    """Run every warmup sample of ``config`` through ``target``: ``count`` runs per instance, one at a time.

    ``label`` names the version in the log and in errors. ModelLoadError says which sample failed and why.
    """
    if len(config.model_warmup) == 0:
        return
    try:
        samples = build_samples(config, model_dir, inputs)
    except ModelsvcError as exc:  # a datatype this server cannot make (BF16 without ml_dtypes)
        raise ModelLoadError(f"warmup: {exc.message}") from exc
    start = time.perf_counter_ns()
    runs = 0
    for name, arrays, count in samples:
        for _ in range(count * max(instances, 1)):
            began = time.perf_counter_ns()
            try:
                await target.enqueue(WorkItem(arrays, outputs))
            except ModelsvcError as exc:
                raise ModelLoadError(f"{name} failed: {exc.message}") from exc
            target.stats.success.add(time.perf_counter_ns() - began)  # the scheduler counted the rest
            runs += 1
    elapsed_ms = (time.perf_counter_ns() - start) / 1e6
    logger.info("%s warmed up: %d sample(s), %d run(s) in %.1f ms", label, len(samples), runs, elapsed_ms)
