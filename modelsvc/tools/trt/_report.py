"""The build report's pure parts: layers and their precisions read from TensorRT's engine inspector JSON.

``IEngineInspector.get_engine_information(LayerInformationFormat.JSON)`` gives ``{"Layers": [...]}``. With
``ProfilingVerbosity.DETAILED`` each layer is an object with ``Name``, ``LayerType`` and ``Outputs``; an
output's precision is in ``"Format/Datatype"`` (TensorRT 10.x: ``"Row major linear FP16 format"``) or in
``"DataType"`` (11.x: ``"Half"``). Without DETAILED the layers are bare names and no precision is known.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LayerInfo", "layers_from_inspector", "precision_counts"]

# TensorRT's datatype spellings -> the model configuration's names (without TYPE_)
_DATATYPES = {
    "float": "FP32",
    "fp32": "FP32",
    "half": "FP16",
    "fp16": "FP16",
    "bfloat16": "BF16",
    "bf16": "BF16",
    "fp8": "FP8",
    "int8": "INT8",
    "uint8": "UINT8",
    "int32": "INT32",
    "int64": "INT64",
    "bool": "BOOL",
    "int4": "INT4",
    "fp4": "FP4",
}
_WORD = re.compile(r"[A-Za-z0-9]+")


@dataclass(frozen=True, slots=True)
class LayerInfo:
    """One layer of the built engine, as the engine inspector describes it."""

    name: str
    #: TensorRT's layer type (``CaskGemm``, ``Reformat``, ``Myelin`` ...); empty where not given
    layer_type: str
    #: the datatypes of its outputs (``FP16``, ``INT8`` ...), in order; empty where not given
    precisions: tuple[str, ...]


def _datatype(text: str) -> str | None:
    for word in _WORD.findall(text):
        found = _DATATYPES.get(word.lower())
        if found:
            return found
    return None


def _output_precision(output: Any) -> str | None:
    if not isinstance(output, dict):
        return None
    for key in ("DataType", "Format/Datatype", "Format"):
        value = output.get(key)
        if isinstance(value, str):
            found = _datatype(value)
            if found:
                return found
    return None


def layers_from_inspector(text: str) -> list[LayerInfo]:
    """The layers in the inspector's JSON; a layer without details becomes a name with no type or precision.

    Text that is not the inspector's JSON gives no layers (the report then says none were given)."""
    try:
        info = json.loads(text)
    except ValueError:
        return []
    raw = info.get("Layers") if isinstance(info, dict) else None
    if not isinstance(raw, list):
        return []
    layers: list[LayerInfo] = []
    for entry in raw:
        if isinstance(entry, str):
            layers.append(LayerInfo(entry, "", ()))
        elif isinstance(entry, dict):
            outputs = entry.get("Outputs")
            precisions = [_output_precision(o) for o in outputs] if isinstance(outputs, list) else []
            layers.append(
                LayerInfo(
                    str(entry.get("Name", "")),
                    str(entry.get("LayerType", "")),
                    tuple(p for p in precisions if p),
                )
            )
    return layers


def precision_counts(layers: Sequence[LayerInfo]) -> dict[str, int]:
    """How many layers produce each precision (a layer counts by its first output), most first."""
    counts = Counter(layer.precisions[0] for layer in layers if layer.precisions)
    return dict(counts.most_common())
