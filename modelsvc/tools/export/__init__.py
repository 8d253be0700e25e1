"""A transformers PyTorch model to an ONNX, TorchScript or OpenVINO model in a Triton model repository
(``modelsvc export``), in fp32, bf16 or int8.

``export_model(ExportOptions(...))`` does, in order:

1. loads the model (a local folder, or a hub name already in the cache: nothing is downloaded) in
   float32 with eager attention, for the task asked or the one its config names (``_load``);
2. wraps it in a small module whose positional inputs are the tokenizer's tensors (``input_ids``,
   ``attention_mask`` and, where the model takes it, ``token_type_ids``) and whose outputs are named
   (``last_hidden_state`` and, with pooling, ``sentence_embedding``; ``logits`` for classifiers) (``_wrapper``);
3. exports it with torch.onnx's dynamo exporter at the chosen opset, batch and sequence axes dynamic,
   integer inputs as int64 or int32 (int32 is cast to int64 inside the graph), in one ``.onnx`` file
   unless the weights pass 2 GB (``_onnx``);
4. optionally runs ONNX Runtime's transformer optimizer (``model_type="bert"``), which fuses attention,
   layer normalization and GELU into ONNX Runtime's own operators (``_optimize``);
   or, for ``--precision int8``, ONNX Runtime's dynamic quantization; for ``--format openvino`` converts
   the ONNX model to OpenVINO IR (NNCF's int8 weight compression for int8); with ``--calibration FILE|auto``,
   int8 quantizes the activations too, their ranges measured on windows of that text (``_calibrate``,
   ``_quantize``, ``_smooth``); for ``--format torchscript``
   traces the wrapper with ``torch.jit.trace`` instead of steps 3-4 (``_formats``);
5. checks the written model, run by its own runtime, against PyTorch fp32 on random inputs of several
   shapes, padding included, and refuses to write it when an output differs by more than the tolerance
   (fp32) or a row's cosine similarity falls below ``--min-cosine`` (bf16, int8; calibrated int8 also on
   held-out windows of its calibration text) (``_check``);
6. writes ``<repository>/<name>/<version>/model.onnx`` (``model.pt``; ``model.xml`` + ``model.bin``) and,
   unless one exists already (a user may have tuned it), ``<repository>/<name>/config.pbtxt`` with
   ``backend: "onnxruntime"`` (``platform: "pytorch_libtorch"``; ``backend: "openvino"``, and the parameter
   ``HINT_BF16`` ``YES`` for bf16) (``_config``, ``_export``).

Why the exported graph is shaped the way it is (checked with torch 2.13, transformers 5, ONNX Runtime
1.31) is told where it is done: the dynamo exporter in ``_onnx``, the prepared attention mask in
``_wrapper``, the split Unsqueezes and the raw mask of the fused Attention in ``_optimize``, what the
check compares in ``_check``.

Errors::

    ExportError               anything that stops an export
    ├── ExportUsageError      bad options, a model that cannot be found or loaded, torch not installed
    └── ExportCheckError      the written model and PyTorch disagree beyond the tolerance or cosine bound
"""

from ._config import make_config
from ._errors import ExportCheckError, ExportError, ExportUsageError
from ._export import export_model
from ._options import (
    CALIBRATED_MIN_COSINE,
    FORMATS,
    INT_DTYPES,
    KINDS,
    POOLINGS,
    PRECISIONS,
    TASKS,
    ExportOptions,
    ExportReport,
)

__all__ = [
    "CALIBRATED_MIN_COSINE",
    "FORMATS",
    "INT_DTYPES",
    "KINDS",
    "POOLINGS",
    "PRECISIONS",
    "TASKS",
    "ExportCheckError",
    "ExportError",
    "ExportOptions",
    "ExportReport",
    "ExportUsageError",
    "export_model",
    "make_config",
]
