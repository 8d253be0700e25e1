"""Loading the model to export: torch and transformers imported lazily, the task resolved, the weights read.

Nothing is downloaded: a model is a local folder or a hub name already in the cache. The model comes back
in eval mode, float32, with eager attention, with the input names its own tokenizer makes (where it has one).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import ExportUsageError, first_line
from ._options import ExportOptions

__all__ = ["INSTALL_HINT", "Loaded", "Torch", "import_torch", "load", "transformers_quiet"]

#: the install hint for the export extra; a CPU torch first, or pip fetches CUDA builds of several GB
INSTALL_HINT = "pip install torch --index-url https://download.pytorch.org/whl/cpu && pip install 'modelsvc[export]'"


@dataclass
class Torch:
    """The lazily imported modules (typed Any: they are optional, and mypy may run without them)."""

    torch: Any
    transformers: Any


def import_torch() -> Torch:
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
    return Torch(torch, importlib.import_module("transformers"))


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
class Loaded:
    """The model in eval mode, float32, eager attention; its config; the task; its tokenizer's input names."""

    model: Any
    config: Any
    task: str
    tokenizer_inputs: tuple[str, ...] | None


def load(mods: Torch, options: ExportOptions) -> Loaded:
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
        raise ExportUsageError(f"cannot load the config of model {source!r}{where}: {first_line(exc)}") from exc
    task = _resolve_task(options, config)
    auto = getattr(mods.transformers, _AUTO_CLASSES[task])
    try:
        model = auto.from_pretrained(source, config=config, local_files_only=True, attn_implementation="eager")
    except Exception as exc:
        raise ExportUsageError(f"cannot load model {source!r} for {task}: {first_line(exc)}") from exc
    return Loaded(model.float().eval(), config, task, _tokenizer_inputs(mods, source))


def _tokenizer_inputs(mods: Torch, source: str) -> tuple[str, ...] | None:
    """The input names of the model's own tokenizer, where one comes with it."""
    try:
        tokenizer = mods.transformers.AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception:  # no tokenizer files, or one transformers cannot build: decide from the model alone
        return None
    return tuple(tokenizer.model_input_names)


@contextmanager
def transformers_quiet(transformers: Any) -> Iterator[None]:
    """No weight-loading progress bars in a command's output."""
    logging_utils = transformers.utils.logging
    enabled = logging_utils.is_progress_bar_enabled()
    logging_utils.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging_utils.enable_progress_bar()
