from __future__ import annotations

import os

# The tests start servers with subprocess and a preexec_fn, that is fork then exec, from a process whose gRPC
# clients may be busy on other threads. gRPC's fork handlers then run in the child and can abort it before
# exec ("epoll_wait error: Bad file descriptor"). The children exec at once and need none of that.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess

DTYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
]
_CONFIG_TYPE = {d: f"TYPE_{'STRING' if d == 'BYTES' else d}" for d in [*DTYPES, "BF16"]}


def infer_input(name: str, array: np.ndarray[Any, Any], binary: bool = True) -> httpclient.InferInput:
    """tritonclient's HTTP input for ``array`` (binary tensor data unless ``binary`` is False)."""
    inp = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    inp.set_data_from_numpy(array, binary_data=binary)
    return inp


def identity_config(
    name: str,
    datatype: str = "FP32",
    extra: str = "dynamic_batching { }",
    max_batch_size: int = 8,
    dims: str = "16",
) -> str:
    t = _CONFIG_TYPE[datatype]
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: {t} dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT0" data_type: {t} dims: [ {dims} ] }} ]
{extra}
"""


HELD = "dynamic_batching { max_queue_delay_microseconds: 60000000 }"
TIMED = """dynamic_batching {
  max_queue_delay_microseconds: 60000000
  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: 200000
    allow_timeout_override: true
    max_queue_size: 2
  }
}"""


BOUNDED = """dynamic_batching {
  max_queue_delay_microseconds: 60000000
  default_queue_policy { max_queue_size: 1 }
}"""


def build_main_repository(repo: Path) -> Path:
    om.write_model(repo, "identity", om.identity(), identity_config("identity"))
    om.write_model(
        repo,
        "add_sub",
        om.add_sub(),
        """name: "add_sub"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { }
""",
    )
    om.write_model(repo, "auto_add_sub", om.add_sub(), None)
    for dt in DTYPES:
        name = f"identity_{dt.lower()}"
        om.write_model(repo, name, om.identity(dt, ["batch", 4]), identity_config(name, dt, dims="4"))
    om.write_model(
        repo, "identity_bf16", om.identity("BF16", ["batch", 4]), identity_config("identity_bf16", "BF16", dims="4")
    )
    om.write_model(
        repo,
        "token",
        om.token_classifier(layers=1),
        """name: "token"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
        { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
""",
    )
    om.write_model(repo, "nobatch", om.identity(dims=[16]), identity_config("nobatch", extra="", max_batch_size=0))
    om.write_model(
        repo,
        "versioned",
        om.identity(),
        identity_config("versioned", extra="version_policy { latest { num_versions: 2 } }"),
        versions=(1, 2, 3),
    )
    om.write_model(repo, "held", om.identity(), identity_config("held", extra=HELD))
    om.write_model(repo, "timed", om.identity(), identity_config("timed", extra=TIMED))
    om.write_model(repo, "bounded", om.identity(), identity_config("bounded", extra=BOUNDED))
    return repo


@pytest.fixture(scope="session")
def main_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_main_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="session")
def server(main_repository: Path) -> Iterator[ModelsvcProcess]:
    """One server for the read-mostly tests; tests that stop or break a server start their own."""
    with ModelsvcProcess(main_repository, "--http-max-input-size", "1048576") as proc:
        yield proc
