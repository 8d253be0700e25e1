"""The model repositories of the grid benchmark (loadtests/grid/bench.py): one identity model per
(max_batch_size, max_queue_delay_microseconds) pair, as a Triton python-backend model (the same model.py for
modelsvc and Triton) and, for modelsvc only, as an ONNX Runtime model (Triton's wheel has no ONNX Runtime)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from loadtests.harness import _servers

SMALL_DIM = 16
LARGE_DIM = 1 << 20  # FP32 [1, 1048576]: 4 MiB a request
LARGE_BYTES = 4 * LARGE_DIM

CONFIG = """\
name: "{name}"
{engine}
max_batch_size: {mbs}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {dim} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {dim} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

ENGINES = {"python": 'backend: "python"', "onnx": 'platform: "onnxruntime_onnx"'}

#: the three columns of every cell: (label, server, model kind)
VARIANTS = (
    ("modelsvc-python", "modelsvc", "python"),
    ("modelsvc-onnx", "modelsvc", "onnx"),
    ("triton-python", "triton", "python"),
)


@dataclass(frozen=True)
class Config:
    """One model configuration: max_batch_size, queue delay in microseconds, and the tensor's width."""

    mbs: int
    delay_us: int
    dim: int = SMALL_DIM

    def model(self, kind: str) -> str:
        """The model's name in both repositories for ``kind`` (python or onnx)."""
        size = "large" if self.dim != SMALL_DIM else f"d{self.delay_us}"
        return f"{'py' if kind == 'python' else 'onnx'}_m{self.mbs}_{size}"

    def config_text(self, kind: str) -> str:
        return CONFIG.format(
            name=self.model(kind), engine=ENGINES[kind], mbs=self.mbs, delay=self.delay_us, dim=self.dim
        )


def write_repositories(
    modelsvc_repo: Path, triton_repo: Path | None, configs: Iterable[Config], kinds: Iterable[str]
) -> None:
    """modelsvc's repository gets every kind asked for; Triton's (when given) the python models."""
    from modelsvc.tools.onnx_models import identity, write_model

    kinds = list(kinds)
    for cfg in dict.fromkeys(configs):
        if "python" in kinds:
            _servers.write_triton_identity(modelsvc_repo, cfg.model("python"), cfg.config_text("python"))
        if "onnx" in kinds:
            write_model(modelsvc_repo, cfg.model("onnx"), identity(dims=["batch", cfg.dim]), cfg.config_text("onnx"))
        if triton_repo is not None:
            _servers.write_triton_identity(triton_repo, cfg.model("python"), cfg.config_text("python"))
