"""The formats besides plain ONNX: TorchScript, OpenVINO IR, and the lower precisions; and a runner for each.

- torchscript: ``torch.jit.trace`` of the same wrapper (pooling heads included), with the additive 4-D mask
  built by the wrapper (plain tensor operations, so the trace follows any batch and sequence length; the
  model's own mask code has Python branches on the length that a trace would freeze). Its forward()
  arguments are the input names Triton's PyTorch backend maps the config's inputs to. ``bf16`` traces a
  bfloat16 copy of the model whose outputs are cast back to float32, so the config stays ``TYPE_FP32``.
- openvino: ``openvino.convert_model`` of the exported (unfused) ONNX model, saved uncompressed
  (``compress_to_fp16=False``) as ``model.xml`` + ``model.bin``; ``int8`` compresses the weights of its
  MatMuls to int8 with NNCF (``nncf.compress_weights``, data-free, asymmetric per channel); ``bf16`` keeps
  the fp32 IR and asks the CPU plugin for bfloat16 through the config's parameter ``HINT_BF16`` ``YES``
  (Triton's OpenVINO backend's key; OpenVINO's property is ``INFERENCE_PRECISION_HINT``), which a CPU
  without native bf16 (AVX-512 BF16 or AMX) answers by running f32: the report says what ran.
- onnx int8: ONNX Runtime's ``quantize_dynamic`` of the unfused graph's weighted MatMuls, per channel
  (int8 weights, activations quantized at run time).
- int8 with ``--calibration``: activations quantized too, ranges measured on text (``_quantize``).

A runner takes the check's feeds and returns the plan's outputs in order, the way the serving backend
will run them.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._check import Run
from ._errors import ExportError, ExportUsageError, first_line
from ._inputs import Feeds
from ._load import Torch
from ._onnx import quiet
from ._wrapper import Plan, wrap

__all__ = [
    "BF16_PARAMETER",
    "OPENVINO_HINT",
    "import_openvino",
    "onnx_int8",
    "onnx_runner",
    "openvino_convert",
    "openvino_runner",
    "ov_type_name",
    "torchscript_export",
    "torchscript_runner",
]

#: the OpenVINO property that asks the CPU plugin for an inference precision
OPENVINO_HINT = "INFERENCE_PRECISION_HINT"
#: the config parameter of Triton's OpenVINO backend that asks for bf16, and its value
BF16_PARAMETER = ("HINT_BF16", "YES")
_OV_HINTS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}


def import_openvino(precision: str) -> Any:
    try:
        ov = importlib.import_module("openvino")
        if precision == "int8":
            importlib.import_module("nncf")
    except ImportError as exc:
        raise ExportUsageError(
            f"--format openvino needs OpenVINO{' and NNCF' if precision == 'int8' else ''} "
            f"({first_line(exc)}): pip install 'modelsvc[openvino]'"
        ) from None
    return ov


# --- TorchScript -------------------------------------------------------------------------------------


def torchscript_export(mods: Torch, model: Any, plan: Plan, feeds: Feeds, target: Path, precision: str) -> None:
    """Trace the wrapper (bfloat16 weights for bf16, outputs cast to float32) and save it at ``target``."""
    torch = mods.torch
    inner = wrap(torch, model if precision == "fp32" else _bf16_copy(torch, model), plan, prepared_mask=True)
    module = inner if precision == "fp32" else _float_outputs(torch, inner)
    args = tuple(torch.from_numpy(feeds[name]) for name in plan.input_names)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(module, args, check_trace=False)
            traced.save(str(target))
    except Exception as exc:  # tracing raises many kinds
        raise ExportError(f"torch.jit.trace could not trace the model: {first_line(exc)}") from exc


def _bf16_copy(torch: Any, model: Any) -> Any:
    import copy

    return copy.deepcopy(model).to(torch.bfloat16)


def _float_outputs(torch: Any, inner: Any) -> Any:
    class FloatOutputs(torch.nn.Module):  # type: ignore[misc]  # torch is imported lazily, typed Any
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> tuple[Any, ...]:
            if token_type_ids is None:
                outputs = self.inner(input_ids, attention_mask)
            else:
                outputs = self.inner(input_ids, attention_mask, token_type_ids)
            return tuple(o.to(torch.float32) for o in outputs)

    return FloatOutputs().eval()


def torchscript_runner(mods: Torch, path: Path, plan: Plan) -> Run:
    torch = mods.torch
    with warnings.catch_warnings():  # torch 2.13 calls TorchScript deprecated; Triton's backend serves it
        warnings.simplefilter("ignore", DeprecationWarning)
        loaded = torch.jit.load(str(path), map_location="cpu").eval()

    def run(feeds: Feeds) -> Sequence[npt.NDArray[Any]]:
        with torch.no_grad():
            outputs = loaded(*(torch.from_numpy(feeds[name]) for name in plan.input_names))
        return [o.detach().float().numpy() for o in outputs]

    return run


# --- ONNX --------------------------------------------------------------------------------------------


def onnx_int8(source: Path, target: Path) -> None:
    """ONNX Runtime's dynamic quantization: int8 weights (per channel) for MatMuls, activations at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with quiet("nncf", "root", "onnxruntime"):
        quantize_dynamic(
            str(source), str(target), weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"]
        )


def onnx_runner(path: Path, plan: Plan) -> Run:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def run(feeds: Feeds) -> Sequence[npt.NDArray[Any]]:
        return [np.asarray(o) for o in session.run(list(plan.output_names), dict(feeds))]

    return run


# --- OpenVINO ----------------------------------------------------------------------------------------


def openvino_convert(
    ov: Any, source: Path, target: Path, precision: str, calibrate: Callable[[Any], Any] | None = None
) -> None:
    """``source`` (ONNX) to OpenVINO IR at ``target`` (model.xml, and model.bin beside it); int8 with
    ``calibrate`` (the IR in, the quantized IR out) quantizes activations too, else the weights only."""
    try:
        model = ov.convert_model(str(source))
    except Exception as exc:  # OpenVINO's frontends raise their own kinds
        raise ExportError(f"openvino.convert_model could not convert the ONNX model: {first_line(exc)}") from exc
    if calibrate is not None:
        model = calibrate(model)
    elif precision == "int8":
        nncf = importlib.import_module("nncf")
        with quiet("nncf", "root", "onnxruntime"):
            model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    ov.save_model(model, str(target), compress_to_fp16=False)


def openvino_runner(ov: Any, path: Path, plan: Plan, precision: str, calibrated: bool = False) -> tuple[Run, str]:
    """A runner on OpenVINO's CPU plugin with the precision hint the config will carry, and what it ran at.
    Calibrated int8 runs with no hint, as its config (none) serves it: the plugin's own choice for what stays
    float (bf16 on a CPU with native bf16, f32 elsewhere)."""
    core = ov.Core()
    compiled = core.compile_model(str(path), "CPU", {} if calibrated else {OPENVINO_HINT: _OV_HINTS[precision]})
    ran = ov_type_name(str(compiled.get_property(OPENVINO_HINT)))
    outputs = [compiled.output(name) for name in plan.output_names]
    request = compiled.create_infer_request()

    def run(feeds: Feeds) -> Sequence[npt.NDArray[Any]]:
        result = request.infer(dict(feeds))
        return [np.array(result[port]) for port in outputs]

    return run, ran


def ov_type_name(ran: str) -> str:
    """``<Type: 'float32'>`` (how OpenVINO prints a type) -> ``f32`` (the property's own spelling)."""
    name = ran.split("'")[1] if "'" in ran else ran
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}.get(name, name)
