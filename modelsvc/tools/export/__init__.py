"""A transformers PyTorch model to an ONNX model in a Triton model repository (``modelsvc export``).

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
5. checks the ONNX model against PyTorch on random inputs of several shapes, padding included, and
   refuses to write ``model.onnx`` when an output differs by more than the tolerance (``_check``);
6. writes ``<repository>/<name>/<version>/model.onnx`` and, unless one exists already (a user may have
   tuned it), ``<repository>/<name>/config.pbtxt`` (``_config``, ``_export``).

Why the exported graph is shaped the way it is (checked with torch 2.13, transformers 5, ONNX Runtime
1.31) is told where it is done: the dynamo exporter in ``_onnx``, the prepared attention mask in
``_wrapper``, the split Unsqueezes and the raw mask of the fused Attention in ``_optimize``, what the
check compares in ``_check``.

Errors::

    ExportError               anything that stops an export
    ├── ExportUsageError      bad options, a model that cannot be found or loaded, torch not installed
    └── ExportCheckError      ONNX Runtime and PyTorch disagree beyond the tolerance
"""

from ._config import make_config
from ._errors import ExportCheckError, ExportError, ExportUsageError
from ._export import export_model
from ._options import INT_DTYPES, KINDS, POOLINGS, TASKS, ExportOptions, ExportReport

__all__ = [
    "INT_DTYPES",
    "KINDS",
    "POOLINGS",
    "TASKS",
    "ExportCheckError",
    "ExportError",
    "ExportOptions",
    "ExportReport",
    "ExportUsageError",
    "export_model",
    "make_config",
]
