"""A transformers PyTorch model to an ONNX model in a Triton model repository (``modelsvc export``).

``export_model(ExportOptions(...))`` does, in order:

1. loads the model (a local folder, or a hub name already in the cache: nothing is downloaded) in
   float32 with eager attention, for the task asked or the one its config names;
2. wraps it in a small module whose positional inputs are the tokenizer's tensors (``input_ids``,
   ``attention_mask`` and, where the model takes it, ``token_type_ids``) and whose outputs are named
   (``last_hidden_state`` and, with pooling, ``sentence_embedding``; ``logits`` for classifiers);
3. exports it with torch.onnx's dynamo exporter at the chosen opset, batch and sequence axes dynamic,
   integer inputs as int64 or int32 (int32 is cast to int64 inside the graph), in one ``.onnx`` file
   unless the weights pass 2 GB;
4. optionally runs ONNX Runtime's transformer optimizer (``model_type="bert"``), which fuses attention,
   layer normalization and GELU into ONNX Runtime's own operators;
5. checks the ONNX model against PyTorch on random inputs of several shapes, padding included, and
   refuses to write ``model.onnx`` when an output differs by more than the tolerance;
6. writes ``<repository>/<name>/<version>/model.onnx`` and, unless one exists already (a user may have
   tuned it), ``<repository>/<name>/config.pbtxt``.

Why the exported graph is shaped the way it is (checked with torch 2.13, transformers 5, ONNX Runtime 1.31):

- torch.onnx's older TorchScript exporter gives wrong results for BERT under transformers 5, so only the
  dynamo exporter is used.
- ONNX Runtime's attention fusion matches a handful of mask subgraphs. The one transformers 5 builds
  from a 2-D ``attention_mask`` is not among them (after the dynamo export it is a GatherND and two Ands),
  and its eager attention scales the scores with a Mul, which the fusion takes for the mask's Mul in the
  older ``(1 - mask) * min`` form. So, when optimizing, the wrapper builds the additive 4-D mask itself,
  in the form of transformers 4's SDPA path (``Where(Cast(1 - Cast(Expand(mask[:, None, None, :]))),
  min, ...)``) that the fusion knows, and hands it to the model, which uses a 4-D mask as given. The
  exporter folds ``mask[:, None, None, :]`` into a single two-axis Unsqueeze, while the fusion looks
  for two Unsqueezes, so multi-axis Unsqueezes are split again before optimizing. The reference the
  check compares with is always the model's own 2-D mask path, so this rewrite is checked too.
- The fused Attention gets the raw 2-D mask (``use_raw_attention_mask``), not ONNX Runtime's default
  for BERT of one length per row, which would be wrong for left padding or a mask with holes.

The check compares every output with ``max(abs(onnx - torch))``. For per-token outputs
(``last_hidden_state``, token-classification ``logits``) only positions whose ``attention_mask`` is 1
count: a padded position's value means nothing, and fused kernels are free to compute it differently.

Errors::

    ExportError               anything that stops an export
    ├── ExportUsageError      bad options, a model that cannot be found or loaded, torch not installed
    └── ExportCheckError      ONNX Runtime and PyTorch disagree beyond the tolerance
"""

from __future__ import annotations

import contextlib
import importlib
import inspect as pyinspect
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from google.protobuf import text_format
from onnx import helper, numpy_helper
from tritonclient.grpc import model_config_pb2

from .inspect_model import TensorInfo, onnx_tensors

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

TASKS = ("auto", "feature-extraction", "sequence-classification", "token-classification")
POOLINGS = ("none", "mean", "cls")
INT_DTYPES = ("int64", "int32")
KINDS = ("KIND_CPU", "KIND_GPU")

#: the install hint for the export extra; a CPU torch first, or pip fetches CUDA builds of several GB
INSTALL_HINT = "pip install torch --index-url https://download.pytorch.org/whl/cpu && pip install 'modelsvc[export]'"

_MODEL_FILE = "model.onnx"
_CONFIG_FILE = "config.pbtxt"
# ONNX's protobuf limit is 2 GiB; above this, weights go to an external data file next to model.onnx
_EXTERNAL_DATA_BYTES = 1_900_000_000
# (batch, sequence) of the random inputs the check runs; every case but the first pads some rows
_CHECK_SHAPES = ((1, 7), (3, 33), (2, 64))
_TRACE_SHAPE = (2, 16)
_SEED = 20240605


def _log_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ExportOptions:
    """What to export, and how; the fields are ``modelsvc export``'s flags."""

    #: a local transformers model folder (config.json and weights) or a hub name already in the cache
    model: str
    #: the Triton model repository to write into
    model_repository: Path
    #: the model's folder and name in the repository
    model_name: str
    #: the numbered version folder that receives model.onnx
    version: int = 1
    #: auto (from the config's ``architectures``), feature-extraction, sequence-classification or
    #: token-classification
    task: str = "auto"
    #: feature-extraction only: none, mean (over tokens whose attention_mask is 1, as sentence-transformers
    #: does) or cls (the first token); adds the output ``sentence_embedding`` [batch, hidden]
    pooling: str = "none"
    #: L2-normalize ``sentence_embedding`` inside the graph
    normalize: bool = False
    #: the ONNX operator set to export with
    opset: int = 18
    #: int64 or int32 for the integer inputs; int32 inputs are cast to int64 inside the graph
    int_dtype: str = "int64"
    #: run ONNX Runtime's transformer optimizer (attention fusion) and report what it fused
    optimize: bool = False
    #: config.pbtxt ``max_batch_size``; 0 writes a model without Triton batching (dims then include the batch)
    max_batch_size: int = 8
    #: write a ``dynamic_batching`` block (needs max_batch_size > 0)
    dynamic_batching: bool = True
    #: ``dynamic_batching.max_queue_delay_microseconds``
    max_queue_delay_microseconds: int = 0
    #: ``dynamic_batching.preferred_batch_size``
    preferred_batch_size: tuple[int, ...] = ()
    #: ``instance_group[0].count``
    instance_count: int = 1
    #: ``instance_group[0].kind``: KIND_CPU or KIND_GPU
    kind: str = "KIND_CPU"
    #: the largest max abs difference between ONNX Runtime and PyTorch accepted for any output
    tolerance: float = 1e-4
    #: replace an existing config.pbtxt; without it an existing one is kept
    overwrite_config: bool = False
    #: where progress lines go (stderr by default)
    log: Callable[[str], None] = field(default=_log_stderr, compare=False, repr=False)


@dataclass(frozen=True)
class ExportReport:
    """What ``export_model`` wrote and measured."""

    model_path: Path
    config_path: Path
    #: False when an existing config.pbtxt was kept
    config_written: bool
    #: the tensors as the config declares them: Triton datatypes, dims without the batch dim when
    #: max_batch_size > 0, -1 for a dynamic dim
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    #: per output, the largest abs difference between ONNX Runtime and PyTorch over the check's inputs
    #: (of the optimized model when optimizing)
    max_abs_diff: dict[str, float]
    #: ONNX Runtime's count of each fused operator it produced (only those it produced); empty unless optimizing
    fused_operators: dict[str, int]
    #: the opset of the written model, and the task that was exported
    opset: int = 0
    task: str = ""
    #: seconds spent exporting, optimizing and checking
    timings: dict[str, float] = field(default_factory=dict)


class ExportError(Exception):
    """An export failed; the message says why in one line."""


class ExportUsageError(ExportError):
    """The options are wrong, the model cannot be found or loaded, or torch is not installed."""


class ExportCheckError(ExportError):
    """ONNX Runtime's outputs differ from PyTorch's beyond the tolerance; model.onnx was not written."""

    def __init__(self, message: str, max_abs_diff: dict[str, float]) -> None:
        super().__init__(message)
        #: per output, the measured max abs difference
        self.max_abs_diff = max_abs_diff


# --- options -----------------------------------------------------------------------------------------


def _validate(options: ExportOptions) -> None:
    def bad(message: str) -> ExportUsageError:
        return ExportUsageError(message)

    if options.task not in TASKS:
        raise bad(f"task {options.task!r} is not one of {', '.join(TASKS)}")
    if options.pooling not in POOLINGS:
        raise bad(f"pooling {options.pooling!r} is not one of {', '.join(POOLINGS)}")
    if options.pooling != "none" and options.task not in ("auto", "feature-extraction"):
        raise bad(f"pooling applies to feature-extraction, not {options.task}")
    if options.normalize and options.pooling == "none":
        raise bad("normalize needs a pooling (mean or cls): it normalizes sentence_embedding")
    if options.int_dtype not in INT_DTYPES:
        raise bad(f"int dtype {options.int_dtype!r} is not one of {', '.join(INT_DTYPES)}")
    if options.kind not in KINDS:
        raise bad(f"kind {options.kind!r} is not one of {', '.join(KINDS)}")
    name = options.model_name
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise bad(f"model name {name!r} cannot be a folder name in a model repository")
    if options.version < 1:
        raise bad(f"version {options.version} must be at least 1")
    if options.opset < 7:
        raise bad(f"opset {options.opset} is older than ONNX Runtime supports")
    if options.max_batch_size < 0:
        raise bad(f"max batch size {options.max_batch_size} cannot be negative")
    if options.max_queue_delay_microseconds < 0:
        raise bad("max queue delay cannot be negative")
    if options.preferred_batch_size:
        if options.max_batch_size == 0 or not options.dynamic_batching:
            raise bad("preferred batch sizes need dynamic batching and a max batch size above 0")
        wrong = [n for n in options.preferred_batch_size if not 1 <= n <= options.max_batch_size]
        if wrong:
            raise bad(f"preferred batch sizes {wrong} are outside 1..{options.max_batch_size} (the max batch size)")
    if options.instance_count < 1:
        raise bad(f"instance count {options.instance_count} must be at least 1")
    if not math.isfinite(options.tolerance) or options.tolerance < 0:
        raise bad(f"tolerance {options.tolerance} must be a number >= 0")


# --- loading -----------------------------------------------------------------------------------------


@dataclass
class _Torch:
    """The lazily imported modules (typed Any: they are optional, and mypy may run without them)."""

    torch: Any
    transformers: Any


def _import_torch() -> _Torch:
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        raise ExportUsageError(f"export needs PyTorch, which is not installed: {INSTALL_HINT}") from None
    try:
        importlib.import_module("onnxscript")
    except ImportError:
        raise ExportUsageError(
            f"export needs onnxscript (torch.onnx's exporter uses it), which is not installed: {INSTALL_HINT}"
        ) from None
    return _Torch(torch, importlib.import_module("transformers"))


def _resolve_task(options: ExportOptions, config: Any) -> str:
    if options.task != "auto":
        return options.task
    if options.pooling != "none":
        return "feature-extraction"
    for architecture in getattr(config, "architectures", None) or ():
        if architecture.endswith("ForSequenceClassification"):
            return "sequence-classification"
        if architecture.endswith("ForTokenClassification"):
            return "token-classification"
    return "feature-extraction"


_AUTO_CLASSES = {
    "feature-extraction": "AutoModel",
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
}


@dataclass(frozen=True)
class _Loaded:
    """The model in eval mode, float32, eager attention; its config; the task; its tokenizer's input names."""

    model: Any
    config: Any
    task: str
    tokenizer_inputs: tuple[str, ...] | None


def _load(mods: _Torch, options: ExportOptions) -> _Loaded:
    source = str(Path(options.model).expanduser()) if options.model.startswith("~") else options.model
    # "org/name" is a hub name; a path that starts like one, or exists, is a folder
    looks_local = source.startswith(("/", ".", "~")) or Path(source).exists()
    if looks_local and not Path(source).is_dir():
        state = "is not a folder" if Path(source).exists() else "does not exist"
        raise ExportUsageError(f"model folder {source} {state}")
    try:
        config = mods.transformers.AutoConfig.from_pretrained(source, local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... by case
        where = "" if looks_local else " (not a local folder, nor in the Hugging Face cache; export never downloads)"
        raise ExportUsageError(f"cannot load the config of model {source!r}{where}: {_first_line(exc)}") from exc
    task = _resolve_task(options, config)
    auto = getattr(mods.transformers, _AUTO_CLASSES[task])
    try:
        model = auto.from_pretrained(source, config=config, local_files_only=True, attn_implementation="eager")
    except Exception as exc:
        raise ExportUsageError(f"cannot load model {source!r} for {task}: {_first_line(exc)}") from exc
    return _Loaded(model.float().eval(), config, task, _tokenizer_inputs(mods, source))


def _tokenizer_inputs(mods: _Torch, source: str) -> tuple[str, ...] | None:
    """The input names of the model's own tokenizer, where one comes with it."""
    try:
        tokenizer = mods.transformers.AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception:  # no tokenizer files, or one transformers cannot build: decide from the model alone
        return None
    return tuple(tokenizer.model_input_names)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


# --- the module torch.onnx exports -------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """The exported graph's interface."""

    task: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    #: outputs indexed by (batch, sequence, ...): compared only where attention_mask is 1
    per_token: frozenset[str]
    pooling: str
    normalize: bool
    int_dtype: str


def _plan(options: ExportOptions, model: Any, config: Any, task: str, tokenizer: tuple[str, ...] | None) -> _Plan:
    """The graph's inputs and outputs. ``token_type_ids`` is an input where the model takes it and its
    tokenizer makes it (without a tokenizer: where the model has more than one token type; with one type
    the ids could only be 0, which the model assumes when it gets none)."""
    accepted = pyinspect.signature(model.forward).parameters
    for required in ("input_ids", "attention_mask"):
        if required not in accepted:
            raise ExportUsageError(f"model {options.model!r} takes no {required}: export handles text models")
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in accepted:
        made = "token_type_ids" in tokenizer if tokenizer is not None else None
        if made or (made is None and int(getattr(config, "type_vocab_size", 0) or 0) > 1):
            names.append("token_type_ids")
    if task == "feature-extraction":
        outputs = ["last_hidden_state"] + (["sentence_embedding"] if options.pooling != "none" else [])
        per_token = {"last_hidden_state"}
    else:
        outputs = ["logits"]
        per_token = {"logits"} if task == "token-classification" else set()
    return _Plan(
        task=task,
        input_names=tuple(names),
        output_names=tuple(outputs),
        per_token=frozenset(per_token),
        pooling=options.pooling if task == "feature-extraction" else "none",
        normalize=options.normalize,
        int_dtype=options.int_dtype,
    )


def _wrap(torch: Any, model: Any, plan: _Plan, prepared_mask: bool) -> Any:
    """An nn.Module: the plan's inputs, positional, in; its outputs, as a tuple in order, out.

    With ``prepared_mask`` the additive 4-D attention mask is built here, in the form ONNX Runtime's
    attention fusion recognizes (see the module docstring); without it the model builds its own.
    """
    fp32 = torch.float32
    lowest = torch.finfo(fp32).min

    class Exportable(torch.nn.Module):  # type: ignore[misc]  # torch is imported lazily, typed Any
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> tuple[Any, ...]:
            ids = input_ids.to(torch.int64)
            mask = attention_mask.to(torch.int64)
            kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask, "return_dict": True}
            if token_type_ids is not None:
                kwargs["token_type_ids"] = token_type_ids.to(torch.int64)
            if prepared_mask:
                batch, length = mask.shape
                expanded = mask[:, None, None, :].expand(batch, 1, length, length).to(fp32)
                inverted = 1.0 - expanded
                kwargs["attention_mask"] = inverted.masked_fill(inverted.to(torch.bool), lowest)
            out = self.inner(**kwargs)
            if plan.task != "feature-extraction":
                return (out.logits,)
            tokens = out.last_hidden_state
            if plan.pooling == "none":
                return (tokens,)
            if plan.pooling == "cls":
                pooled = tokens[:, 0]
            else:  # the mean of the tokens the mask keeps, as sentence-transformers' Pooling computes it
                weights = mask.unsqueeze(-1).to(tokens.dtype)
                pooled = (tokens * weights).sum(dim=1) / torch.clamp(weights.sum(dim=1), min=1e-9)
            if plan.normalize:  # as F.normalize(p=2), written so ONNX Runtime's shape inference follows it
                norm = torch.sqrt((pooled * pooled).sum(dim=1, keepdim=True))
                pooled = pooled / torch.clamp(norm, min=1e-12)
            return (tokens, pooled)

    return Exportable().eval()


# --- inputs ------------------------------------------------------------------------------------------

Feeds = dict[str, npt.NDArray[np.integer[Any]]]


def _random_inputs(rng: np.random.Generator, config: Any, plan: _Plan, batch: int, length: int, pad: bool) -> Feeds:
    """Random token ids within the vocabulary; with ``pad``, row 1 is right-padded and row 2 left-padded
    (not for cls pooling, which reads the first position whether or not it is padding)."""
    dtype = np.int32 if plan.int_dtype == "int32" else np.int64
    vocab = int(getattr(config, "vocab_size", 0) or 100)
    ids = rng.integers(0, vocab, size=(batch, length), dtype=np.int64)
    mask = np.ones((batch, length), np.int64)
    if pad and batch > 1:
        mask[1, max(1, length * 2 // 3) :] = 0
    if pad and batch > 2 and plan.pooling != "cls":
        mask[2, : length // 3] = 0
    feeds: Feeds = {"input_ids": ids.astype(dtype), "attention_mask": mask.astype(dtype)}
    if "token_type_ids" in plan.input_names:
        types = int(getattr(config, "type_vocab_size", 1) or 1)
        feeds["token_type_ids"] = rng.integers(0, types, size=(batch, length), dtype=np.int64).astype(dtype)
    return feeds


def _longest(config: Any) -> int:
    """A sequence length every model of this config takes (RoBERTa-style ones lose 2 positions to padding)."""
    return int(getattr(config, "max_position_embeddings", 0) or 512) - 2


# --- export ------------------------------------------------------------------------------------------


@contextmanager
def _quiet_torch_export() -> Iterator[None]:
    """torch.onnx reports deprecations and hints that are not the user's to act on; keep them out of the way."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._export", "onnxscript")]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _torch_export(mods: _Torch, module: Any, feeds: Feeds, plan: _Plan, opset: int) -> Any:
    torch = mods.torch
    args = tuple(torch.from_numpy(feeds[name]) for name in plan.input_names)
    axes = {0: "batch", 1: "sequence"}
    try:
        with _quiet_torch_export(), torch.no_grad():
            program = torch.onnx.export(
                module,
                args,
                dynamo=True,
                input_names=list(plan.input_names),
                output_names=list(plan.output_names),
                dynamic_shapes={name: axes for name in plan.input_names},
                opset_version=opset,
                verbose=False,
            )
    except Exception as exc:  # torch.export and the ONNX translation raise many kinds
        raise ExportError(f"torch.onnx could not export the model: {_first_line(exc)}") from exc
    if program is None:  # pragma: no cover - dynamo=True always returns a program
        raise ExportError("torch.onnx returned no program")
    return program


def _default_opset(model: onnx.ModelProto) -> int:
    return next((op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), 0)


def _split_unsqueezes(model: onnx.ModelProto) -> int:
    """Turn each Unsqueeze with several constant, non-negative axes into a chain of one-axis Unsqueezes.

    The result is the same tensor (inserting the axes one at a time in ascending order lands each where
    the combined node puts it); ONNX Runtime's attention fusion needs the chain. Returns the count split.
    """
    graph = model.graph
    constants: dict[str, npt.NDArray[Any]] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    nodes: list[onnx.NodeProto] = []
    split = 0
    for node in graph.node:
        axes = constants.get(node.input[1]) if node.op_type == "Unsqueeze" and len(node.input) == 2 else None
        if axes is None or axes.size < 2 or (axes < 0).any():
            nodes.append(node)
            continue
        split += 1
        current = node.input[0]
        ordered = sorted(int(a) for a in axes.reshape(-1))
        for step, axis in enumerate(ordered):
            axis_name = f"{node.output[0]}__axis{axis}"
            graph.initializer.append(numpy_helper.from_array(np.array([axis], np.int64), axis_name))
            out = node.output[0] if step == len(ordered) - 1 else f"{node.output[0]}__unsqueeze{step}"
            nodes.append(helper.make_node("Unsqueeze", [current, axis_name], [out], name=f"{node.name}__{step}"))
            current = out
    if split:
        del graph.node[:]
        graph.node.extend(nodes)
        _drop_unused_initializers(model)
    return split


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    graph = model.graph
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    keep = [t for t in graph.initializer if t.name in used]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)


def _prune_opsets(model: onnx.ModelProto) -> None:
    """Keep the opset imports the graph's nodes use (ONNX Runtime's optimizer writes every domain it knows)."""
    used = {node.domain or "" for node in model.graph.node} | {""}
    keep = [op for op in model.opset_import if (op.domain or "") in used or op.domain == "ai.onnx"]
    del model.opset_import[:]
    model.opset_import.extend(keep)


def _optimize(source: Path, target: Path, config: Any, large: bool) -> dict[str, int]:
    """ONNX Runtime's BERT optimizer on ``source`` (split Unsqueezes first), written to ``target``."""
    try:
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError as exc:  # pragma: no cover - onnxruntime ships onnxruntime.transformers
        raise ExportUsageError(f"optimize needs onnxruntime.transformers: {_first_line(exc)}") from exc
    model = onnx.load(str(source))
    _split_unsqueezes(model)
    prepared = source.with_name("prepared.onnx")
    onnx.save(model, str(prepared), save_as_external_data=large, location="prepared.onnx.data")
    del model
    heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_heads", 0) or 0)
    hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "dim", 0) or 0)
    fusion = FusionOptions("bert")
    fusion.use_raw_attention_mask(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optimized = optimize_model(
            str(prepared), model_type="bert", num_heads=heads, hidden_size=hidden, optimization_options=fusion
        )
    statistics = {op: int(n) for op, n in optimized.get_fused_operator_statistics().items() if n}
    _prune_opsets(optimized.model)
    optimized.save_model_to_file(str(target), use_external_data_format=large)
    return statistics


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


# --- the check ---------------------------------------------------------------------------------------


def _check(
    mods: _Torch, reference: Any, model_path: Path, config: Any, plan: _Plan
) -> tuple[dict[str, float], dict[str, str]]:
    """Per output, the largest abs difference between ONNX Runtime and ``reference`` (and where it was)."""
    import onnxruntime as ort

    torch = mods.torch
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(_SEED + 1)
    worst = dict.fromkeys(plan.output_names, 0.0)
    where = dict.fromkeys(plan.output_names, "")
    limit = _longest(config)
    for index, (batch, length) in enumerate(_CHECK_SHAPES):
        feeds = _random_inputs(rng, config, plan, batch, min(length, limit), pad=index > 0)
        got = session.run(list(plan.output_names), feeds)
        with torch.no_grad():
            expected = reference(*(torch.from_numpy(feeds[n].astype(np.int64)) for n in plan.input_names))
        keep = feeds["attention_mask"].astype(bool)
        for name, ours, theirs in zip(plan.output_names, got, expected, strict=True):
            theirs_np = theirs.detach().cpu().numpy()
            if ours.shape != theirs_np.shape:
                raise ExportError(f"output {name!r} has shape {ours.shape} in ONNX, {theirs_np.shape} in PyTorch")
            delta = np.abs(ours.astype(np.float64) - theirs_np.astype(np.float64))
            if name in plan.per_token:
                delta = delta[keep]
            diff = float(delta.max()) if delta.size else 0.0
            if not math.isfinite(diff):
                diff = math.inf
            if not where[name] or diff > worst[name]:
                worst[name] = diff
                where[name] = f"batch {batch} x {feeds['input_ids'].shape[1]} tokens"
    return worst, where


# --- config.pbtxt ------------------------------------------------------------------------------------


def _config_tensor(tensor: TensorInfo, batched: bool) -> TensorInfo:
    if not batched:
        return tensor
    if not tensor.dims or tensor.dims[0] != -1:
        raise ExportError(f"tensor {tensor.name!r} has dims {list(tensor.dims)}: its first axis is not a dynamic batch")
    return TensorInfo(tensor.name, tensor.datatype, tensor.dims[1:], tensor.names()[1:])


def make_config(options: ExportOptions, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]) -> str:
    """The text of config.pbtxt for the model's tensors (as the config declares them) and the options."""
    config = model_config_pb2.ModelConfig(
        name=options.model_name, backend="onnxruntime", max_batch_size=options.max_batch_size
    )
    for tensor in inputs:
        config.input.add(
            name=tensor.name, data_type=model_config_pb2.DataType.Value(tensor.datatype), dims=list(tensor.dims)
        )
    for tensor in outputs:
        config.output.add(
            name=tensor.name, data_type=model_config_pb2.DataType.Value(tensor.datatype), dims=list(tensor.dims)
        )
    if options.dynamic_batching and options.max_batch_size > 0:
        batching = config.dynamic_batching
        batching.SetInParent()
        batching.max_queue_delay_microseconds = options.max_queue_delay_microseconds
        batching.preferred_batch_size.extend(options.preferred_batch_size)
    config.instance_group.add(
        count=options.instance_count, kind=model_config_pb2.ModelInstanceGroup.Kind.Value(options.kind)
    )
    header = (
        f"# Written by `modelsvc export` from {options.model}. Yours to edit: export keeps an existing\n"
        "# config.pbtxt unless given --overwrite-config.\n"
    )
    return header + text_format.MessageToString(config)


def _config_mismatches(path: Path, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]) -> list[str]:
    """Where a kept config.pbtxt names tensors or datatypes the new model does not have."""
    try:
        config = text_format.Parse(path.read_text(encoding="utf-8"), model_config_pb2.ModelConfig())
    except (OSError, UnicodeDecodeError, text_format.ParseError) as exc:
        return [f"it does not parse: {exc}"]
    problems: list[str] = []
    for kind, declared, actual in (("input", config.input, inputs), ("output", config.output, outputs)):
        by_name = {t.name: t for t in actual}
        for entry in declared:
            tensor = by_name.get(entry.name)
            datatype = model_config_pb2.DataType.Name(entry.data_type)
            if tensor is None:
                problems.append(f"{kind} {entry.name!r} is not in the model")
            elif datatype != tensor.datatype:
                problems.append(f"{kind} {entry.name!r} is {datatype} there, {tensor.datatype} in the model")
    return problems


def _write_text(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


# --- the whole export --------------------------------------------------------------------------------


@contextmanager
def _transformers_quiet(transformers: Any) -> Iterator[None]:
    """No weight-loading progress bars in a command's output."""
    logging_utils = transformers.utils.logging
    enabled = logging_utils.is_progress_bar_enabled()
    logging_utils.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging_utils.enable_progress_bar()


@dataclass(frozen=True)
class _Exported:
    """What the scratch-folder stage hands back."""

    max_abs_diff: dict[str, float]
    fused_operators: dict[str, int]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    opset: int


def _export_into(
    options: ExportOptions,
    mods: _Torch,
    model: Any,
    config: Any,
    plan: _Plan,
    model_dir: Path,
    timings: dict[str, float],
) -> _Exported:
    """Export, optimize and check in a scratch folder inside ``model_dir``; move model.onnx in when it passes."""
    log = options.log
    version_dir = model_dir / str(options.version)
    with tempfile.TemporaryDirectory(prefix=".export-", dir=model_dir) as scratch:
        work = Path(scratch)
        final_dir = work / "final"
        final_dir.mkdir()
        exported = work / "exported" / _MODEL_FILE if options.optimize else final_dir / _MODEL_FILE
        exported.parent.mkdir(exist_ok=True)

        started = time.monotonic()
        trace = _random_inputs(np.random.default_rng(_SEED), config, plan, *_TRACE_SHAPE, pad=True)
        module = _wrap(mods.torch, model, plan, prepared_mask=options.optimize)
        program = _torch_export(mods, module, trace, plan, options.opset)
        produced = _default_opset(program.model_proto)
        if produced != options.opset:
            raise ExportUsageError(
                f"torch.onnx wrote opset {produced}, not the {options.opset} asked for "
                "(its converter could not take this model there); choose another opset, 18 is the exporter's own"
            )
        with _quiet_torch_export():
            program.save(str(exported))
        del program
        timings["export"] = time.monotonic() - started
        log(f"exported with opset {produced} in {timings['export']:.1f} s")

        fused: dict[str, int] = {}
        if options.optimize:
            started = time.monotonic()
            large = _folder_bytes(exported.parent) > _EXTERNAL_DATA_BYTES
            fused = _optimize(exported, final_dir / _MODEL_FILE, config, large)
            timings["optimize"] = time.monotonic() - started
            shown = ", ".join(f"{op} {n}" for op, n in sorted(fused.items())) or "nothing"
            log(f"optimized in {timings['optimize']:.1f} s; fused {shown}")
            if not fused.get("Attention") and not fused.get("MultiHeadAttention"):
                log(
                    "warning: ONNX Runtime's optimizer fused no attention: the model's attention subgraph is not "
                    "one its BERT fusion matches; the model is correct, it only runs without the fused kernel"
                )

        started = time.monotonic()
        reference = _wrap(mods.torch, model, plan, prepared_mask=False)
        diffs, where = _check(mods, reference, final_dir / _MODEL_FILE, config, plan)
        timings["check"] = time.monotonic() - started
        log(f"checked against PyTorch in {timings['check']:.1f} s")
        over = {name: d for name, d in diffs.items() if not d <= options.tolerance}
        if over:
            name, diff = max(over.items(), key=lambda item: item[1])
            raise ExportCheckError(
                f"ONNX Runtime and PyTorch differ on output {name!r}: max abs diff {diff:.3g} > tolerance "
                f"{options.tolerance:g} ({where[name]}); {_MODEL_FILE} not written",
                diffs,
            )

        onnx_model = onnx.load(str(final_dir / _MODEL_FILE), load_external_data=False)
        full_inputs, full_outputs = onnx_tensors(onnx_model)
        batched = options.max_batch_size > 0
        inputs = [_config_tensor(t, batched) for t in full_inputs]
        outputs = [_config_tensor(t, batched) for t in full_outputs]
        opset = _default_opset(onnx_model)
        del onnx_model

        version_dir.mkdir(exist_ok=True)
        for item in final_dir.iterdir():
            os.replace(item, version_dir / item.name)
    return _Exported(diffs, fused, inputs, outputs, opset)


def export_model(options: ExportOptions) -> ExportReport:
    """Export, check and write one model; see the module docstring for the steps."""
    _validate(options)
    log = options.log
    mods = _import_torch()
    timings: dict[str, float] = {}
    started = time.monotonic()
    with _transformers_quiet(mods.transformers):
        loaded = _load(mods, options)
    timings["load"] = time.monotonic() - started
    model, config, task = loaded.model, loaded.config, loaded.task
    plan = _plan(options, model, config, task, loaded.tokenizer_inputs)
    log(f"loaded {options.model} for {task} in {timings['load']:.1f} s; inputs {', '.join(plan.input_names)}")

    model_dir = options.model_repository / options.model_name
    version_dir = model_dir / str(options.version)
    # the folders this export creates (the repository too when it is new), deepest first
    created = [p for p in (model_dir, *model_dir.parents) if not p.exists()]
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportUsageError(f"cannot create {model_dir}: {exc}") from None
    try:
        done = _export_into(options, mods, model, config, plan, model_dir, timings)
    except BaseException:
        for folder in created:  # leave no half-made model folder (nor a new empty repository) behind
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    model_path = version_dir / _MODEL_FILE

    config_path = model_dir / _CONFIG_FILE
    written = options.overwrite_config or not config_path.exists()
    if written:
        _write_text(config_path, make_config(options, done.inputs, done.outputs))
    else:
        log(f"kept the existing {config_path} (--overwrite-config replaces it)")
        for problem in _config_mismatches(config_path, done.inputs, done.outputs):
            log(f"warning: the kept {config_path} does not fit the new model: {problem}")
    if options.max_batch_size == 0 and options.dynamic_batching:
        log("no dynamic_batching written: it needs max_batch_size > 0")
    return ExportReport(
        model_path=model_path,
        config_path=config_path,
        config_written=written,
        inputs=done.inputs,
        outputs=done.outputs,
        max_abs_diff=done.max_abs_diff,
        fused_operators=done.fused_operators,
        opset=done.opset,
        task=task,
        timings=timings,
    )
