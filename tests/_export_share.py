"""One torch.onnx export shared by the exports of a test that are about what follows the export.

``modelsvc export`` spends most of its time in torch.export (seconds for even a 2-layer BERT). Where a test exports
the same model with the same graph interface several times and its point is not the ONNX export itself (quantizing,
converting to OpenVINO, keeping or replacing config.pbtxt, a check that fails), ``shared_onnx_export`` runs the real
exporter once per distinct model and interface in the session and hands the same program to the later exports (in the
same test or another); everything after it (optimize, quantize, convert, check against PyTorch, write) runs for
each export as it would alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from modelsvc.tools.export import _export as export_stages


def _fingerprint(module: Any) -> tuple[Any, ...]:
    """What the exported graph depends on besides the plan: the weights and the wrapper's settings."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().float().numpy().tobytes())
    closure = module.forward.__func__.__closure__ or ()
    settings = tuple(c.cell_contents for c in closure if isinstance(c.cell_contents, bool | int | float | str))
    return digest.hexdigest(), settings


#: every program made inside ``shared_onnx_export`` in this test session, by what it was exported from
_PROGRAMS: dict[tuple[Any, ...], Any] = {}


@contextmanager
def shared_onnx_export() -> Iterator[set[tuple[Any, ...]]]:
    """Inside the block, a torch.onnx export of weights, wrapper and plan already exported in such a block (in this
    test or an earlier one) is not run again; yields the set of distinct exports the block used, so a test can say
    how many there were."""
    real_export = export_stages.torch_export
    used: set[tuple[Any, ...]] = set()

    def shared(mods: Any, module: Any, feeds: Any, plan: Any, opset: int) -> Any:
        key = (_fingerprint(module), plan, opset)
        if key not in _PROGRAMS:
            _PROGRAMS[key] = real_export(mods, module, feeds, plan, opset)
        used.add(key)
        return _PROGRAMS[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(export_stages, "torch_export", shared)
        yield used


def save_tiny_bert(folder: Path, head: str = "Model", labels: int = 2, hidden: int = 32, layers: int = 2) -> Path:
    """A small random BERT (``Bert<head>``: Model, ForSequenceClassification...), its weights nudged off their
    initial values (biases are zeros at init, which would hide a bias that is dropped or misplaced), saved as a
    transformers folder at ``folder``."""
    torch = pytest.importorskip("torch", reason="export needs modelsvc[export]")
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=128,
        num_labels=labels,
    )
    torch.manual_seed(0)
    model = getattr(transformers, f"Bert{head}")(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(folder)
    return folder
