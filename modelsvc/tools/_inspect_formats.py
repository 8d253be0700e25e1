"""``modelsvc inspect`` for TorchScript (``.pt``) and OpenVINO IR (``.xml``): what each file says of its tensors.

- TorchScript keeps forward()'s argument names and the schema's types (``Tensor``), not datatypes nor
  shapes: the inputs are the argument names (the names Triton's PyTorch backend maps a config's inputs to),
  the outputs are numbered ``OUTPUT__<index>`` in the order forward() returns them (Triton's
  ``<name>__<index>`` convention; a config may name them otherwise, in that order), and both show datatype
  and dims as unknown. Reading one needs PyTorch (``modelsvc[pytorch]``).
- OpenVINO IR keeps names, element types and partial shapes: shown as the config's datatypes and dims
  (``-1`` for a dynamic dim). Reading one needs OpenVINO (``modelsvc[openvino]``) and the ``.bin`` beside it.
"""

from __future__ import annotations

import importlib
import math
import warnings
from pathlib import Path
from typing import Any

from ..backends.openvino._openvino_options import OV_TO_CONFIG
from ._inspect_types import InspectError, ModelInfo, TensorInfo

__all__ = ["UNKNOWN", "inspect_openvino", "inspect_torchscript", "openvino_tensors"]

#: the datatype shown where the file records none (TorchScript)
UNKNOWN = "unknown"


def _module(name: str, path: Path, what: str, extra: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise InspectError(f"{path} is {what}; reading it needs {name}: pip install 'modelsvc[{extra}]'") from None


# --- TorchScript -------------------------------------------------------------------------------------


def inspect_torchscript(path: Path) -> ModelInfo:
    torch = _module("torch", path, "a TorchScript model", "pytorch")
    try:
        with warnings.catch_warnings():  # torch 2.13 calls TorchScript deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            loaded = torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:  # torch raises RuntimeError, ValueError, zipfile errors... by case
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InspectError(f"{path} is not a TorchScript model torch.jit.load can read: {first}") from None
    try:
        schema = loaded.forward.schema
    except AttributeError:
        raise InspectError(f"{path} is a TorchScript module without a forward() method") from None
    arguments = [a for a in schema.arguments if a.name != "self"]
    inputs = tuple(TensorInfo(a.name, UNKNOWN, ()) for a in arguments)
    returns = list(schema.returns)
    kinds: list[str] = []
    if len(returns) == 1 and hasattr(returns[0].type, "elements") and callable(returns[0].type.elements):
        kinds = [str(t) for t in returns[0].type.elements()]
    else:
        kinds = [str(r.type) for r in returns]
    outputs = tuple(TensorInfo(f"OUTPUT__{i}", UNKNOWN, ()) for i in range(len(kinds)))
    signature = ", ".join(f"{a.name}: {a.type}" for a in arguments)
    count = nbytes = 0
    for tensor in (*loaded.parameters(), *loaded.buffers()):
        count += int(tensor.numel())
        nbytes += int(tensor.numel()) * int(tensor.element_size())
    notes = (
        f"forward({signature}) -> ({', '.join(kinds)})",
        "TorchScript records no datatypes or shapes: give them in config.pbtxt; outputs are named in forward()'s "
        "order (OUTPUT__<index>, or the config's names in that order)",
    )
    return ModelInfo(
        path=path,
        format="torchscript",
        inputs=inputs,
        outputs=outputs,
        producer=f"PyTorch {torch.__version__} (reading)",
        graph_name=str(loaded.original_name) or None,
        parameter_count=count,
        parameter_bytes=nbytes,
        file_bytes=path.stat().st_size,
        notes=notes,
    )


# --- OpenVINO ----------------------------------------------------------------------------------------


def openvino_tensors(model: Any) -> tuple[tuple[TensorInfo, ...], tuple[TensorInfo, ...]]:
    """An ``openvino.Model``'s inputs and outputs: first names, config datatypes, partial shapes as dims."""
    return tuple(_ov_tensor(p) for p in model.inputs), tuple(_ov_tensor(p) for p in model.outputs)


def _ov_tensor(port: Any) -> TensorInfo:
    names = sorted(port.get_names())
    name = port.get_any_name() if names else ""
    element = port.get_element_type().get_type_name()
    datatype = OV_TO_CONFIG.get(element, f"ov.{element}")
    shape = port.get_partial_shape()
    if shape.rank.is_dynamic:
        return TensorInfo(name, datatype, (-1,), ("any rank",))
    dims = tuple(-1 if d.is_dynamic else int(d.get_length()) for d in shape)
    return TensorInfo(name, datatype, dims, (None,) * len(dims))


def inspect_openvino(path: Path) -> ModelInfo:
    ov = _module("openvino", path, "an OpenVINO IR", "openvino")
    weights = path.with_suffix(".bin")
    if not weights.is_file():
        raise InspectError(f"{path}: OpenVINO IR needs its weights beside it, {weights.name}, which is missing")
    try:
        model = ov.Core().read_model(str(path))
    except Exception as exc:  # OpenVINO raises its own RuntimeError subclasses
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InspectError(f"{path} is not an OpenVINO IR this OpenVINO ({ov.__version__}) can read: {first}") from None
    inputs, outputs = openvino_tensors(model)
    count = nbytes = 0
    precisions: dict[str, int] = {}
    for op in model.get_ops():
        if op.get_type_name() != "Constant":
            continue
        element = op.get_output_element_type(0)
        elements = math.prod(int(d) for d in op.get_output_shape(0))
        count += elements
        nbytes += elements * int(element.bitwidth) // 8
        if elements >= 1024:  # the weights, not the shape constants
            precisions[element.get_type_name()] = precisions.get(element.get_type_name(), 0) + elements
    notes: tuple[str, ...] = ()
    if precisions:
        notes = ("weights: " + ", ".join(f"{t} {n:,}" for t, n in sorted(precisions.items(), key=lambda i: -i[1])),)
    return ModelInfo(
        path=path,
        format="openvino",
        inputs=inputs,
        outputs=outputs,
        producer=f"OpenVINO IR (read by OpenVINO {ov.__version__.split('-')[0]})",
        graph_name=model.get_friendly_name() or None,
        parameter_count=count,
        parameter_bytes=nbytes,
        external_data=(weights.name,),
        file_bytes=path.stat().st_size + weights.stat().st_size,
        notes=notes,
    )
