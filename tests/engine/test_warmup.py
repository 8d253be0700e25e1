"""Model warmup (``model_warmup`` in config.pbtxt): samples run on every instance before a version is published.

A python model that records every execution it sees shows what warmup sent (batch rows, data, which
instance) and that it all happened before the first client request; a model whose warmup waits on a file
shows that the model is not ready while its warmup runs. As in Triton, warmup runs count in the statistics.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from modelsvc.repository import ModelRepository
from modelsvc.server import DataPlane, ModelManager
from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess
from tests.conftest import identity_config

pytestmark = pytest.mark.integration

RECORDER_PY = """\
import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

HISTORY = []
LOCK = threading.Lock()


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            with LOCK:
                HISTORY.append([self.instance, int(x.shape[0]), float(x.sum())])
                text = json.dumps(HISTORY).encode()
            out = np.array([[text]] * x.shape[0], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("HISTORY", out)]))
        return responses
"""

RECORDER_CONFIG = """name: "recorder"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "HISTORY" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
model_warmup [
  { name: "zeros" batch_size: 2 count: 1
    inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } },
  { name: "from_file" batch_size: 1
    inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "x.bin" } } }
]
"""

GATE_PY = """\
import json
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = json.loads(args["model_config"])["parameters"]["folder"]["string_value"]
        self.started = Path(folder) / "started"
        self.go = Path(folder) / "go"

    def execute(self, requests):
        self.started.touch()
        while not self.go.exists():  # warmup waits here until the test lets it go
            time.sleep(0.01)
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", r.inputs()[0].as_numpy())])
            for r in requests
        ]
"""

GATE_CONFIG = """name: "gate"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "folder" value: { string_value: "%s" } }
model_warmup [ { name: "held" batch_size: 1
                 inputs { key: "X" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } } ]
"""

FAILING_PY = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("no warm welcome")
"""


def write_python_model(repo: Path, name: str, model_py: str, config: str) -> Path:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "1" / "model.py").write_text(model_py)
    (repo / name / "config.pbtxt").write_text(config)
    return repo / name


def warmup_entry(name: str, inputs: str, batch_size: int = 1, count: int = 0) -> str:
    return f'model_warmup [ {{ name: "{name}" batch_size: {batch_size} count: {count} {inputs} }} ]'


def warmup_input(name: str, datatype: str, dims: str, source: str) -> str:
    return f'inputs {{ key: "{name}" value: {{ data_type: TYPE_{datatype} dims: [ {dims} ] {source} }} }}'


def bytes_file(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("warmup")
    folder = write_python_model(repo, "recorder", RECORDER_PY, RECORDER_CONFIG)
    (folder / "warmup").mkdir()
    (folder / "warmup" / "x.bin").write_bytes(np.arange(1, 17, dtype=np.float32).tobytes())
    random = warmup_entry("noise", warmup_input("INPUT0", "FP32", "16", "random_data: true"), batch_size=8, count=3)
    om.write_model(repo, "warm_identity", om.identity(), identity_config("warm_identity", extra=random))
    words = warmup_entry("words", warmup_input("INPUT0", "STRING", "4", 'input_data_file: "words.bin"'), batch_size=2)
    folder = om.write_model(
        repo, "warm_bytes", om.identity("BYTES", ["batch", 4]), identity_config("warm_bytes", "BYTES", words, dims="4")
    )
    (folder / "warmup").mkdir()
    (folder / "warmup" / "words.bin").write_bytes(bytes_file([b"a", b"", b"warm", "é".encode()]))
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ModelsvcProcess]:
    with ModelsvcProcess(repository) as proc:
        yield proc


def test_warmup_runs_every_sample_on_every_instance_before_the_first_request(server: ModelsvcProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    try:
        x = httpclient.InferInput("X", [1, 16], "FP32")
        x.set_data_from_numpy(np.full((1, 16), 0.5, np.float32))
        history = json.loads(client.infer("recorder", [x]).as_numpy("HISTORY")[0, 0])
    finally:
        client.close()
    *warmup, first = history
    assert first[1:] == [1, 8.0]  # the client's request comes after every warmup run
    assert len(warmup) == 4  # two samples (count 0 = once) on each of the two instances
    assert sorted(run[1:] for run in warmup) == [[1, 136.0], [1, 136.0], [2, 0.0], [2, 0.0]]
    by_instance: dict[str, list[list[Any]]] = {}
    for run in warmup:
        by_instance.setdefault(run[0], []).append(run[1:])
    assert len(by_instance) == 2
    assert all(sorted(runs) == [[1, 136.0], [2, 0.0]] for runs in by_instance.values())


def test_warmup_is_logged_and_counted_in_the_statistics_as_in_triton(server: ModelsvcProcess) -> None:
    log = server.log()
    assert "model 'warm_identity' version 1 warmed up: 1 sample(s), 6 run(s) in" in log  # count 3 x 2 instances
    assert "model 'warm_bytes' version 1 warmed up: 1 sample(s), 2 run(s) in" in log
    assert "model 'recorder' version 1 warmed up: 2 sample(s), 4 run(s) in" in log
    for model, runs, rows in (("warm_identity", 6, 8), ("warm_bytes", 2, 2)):
        stats = httpx.get(f"{server.base}/v2/models/{model}/stats", timeout=10).json()["model_stats"][0]
        assert stats["execution_count"] == runs
        assert stats["inference_count"] == runs * rows
        assert stats["inference_stats"]["success"]["count"] == stats["inference_stats"]["queue"]["count"] == runs
        assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(rows, runs)]


async def test_a_model_is_not_ready_while_its_warmup_runs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_python_model(repo, "gate", GATE_PY, GATE_CONFIG % tmp_path)
    models = ModelManager(ModelRepository(repo, gpus=()))
    dataplane = DataPlane(models)
    loading = asyncio.create_task(models.load_all())
    try:
        while not (tmp_path / "started").exists():  # the warmup request is inside the model now
            assert not loading.done(), loading.result()
            await asyncio.sleep(0.01)
        assert not dataplane.model_ready("gate")
        assert [row["state"] for row in models.index()] == ["LOADING"]
        (tmp_path / "go").touch()
        assert await loading == []
        assert dataplane.model_ready("gate")
    finally:
        (tmp_path / "go").touch()
        await loading
        await models.close()


async def test_a_warmup_that_cannot_run_fails_the_load_naming_the_sample(tmp_path: Path) -> None:
    def identity(name: str, warmup: str, max_batch_size: int = 8, dims: str = "16") -> None:
        om.write_model(
            tmp_path,
            name,
            om.identity(dims=None if max_batch_size else [16]),
            identity_config(name, extra=warmup, max_batch_size=max_batch_size, dims=dims),
        )

    zeros = warmup_input("INPUT0", "FP32", "16", "zero_data: true")
    identity("wrong_type", warmup_entry("w", warmup_input("INPUT0", "INT32", "16", "zero_data: true")))
    identity("wrong_input", warmup_entry("w", warmup_input("NOPE", "FP32", "16", "zero_data: true")))
    identity("no_input", warmup_entry("w", ""))
    identity("too_many_rows", warmup_entry("w", zeros, batch_size=9))
    identity("unbatched_rows", warmup_entry("w", zeros, batch_size=2), max_batch_size=0)
    identity("open_dims", warmup_entry("w", warmup_input("INPUT0", "FP32", "-1", "zero_data: true")))
    identity("wrong_shape", warmup_entry("w", warmup_input("INPUT0", "FP32", "15", "zero_data: true")))
    identity("no_file", warmup_entry("w", warmup_input("INPUT0", "FP32", "16", 'input_data_file: "gone.bin"')))
    identity("short_file", warmup_entry("w", warmup_input("INPUT0", "FP32", "16", 'input_data_file: "short.bin"')))
    (tmp_path / "short_file" / "warmup").mkdir()
    (tmp_path / "short_file" / "warmup" / "short.bin").write_bytes(b"\0" * 60)
    identity("escape", warmup_entry("w", warmup_input("INPUT0", "FP32", "16", 'input_data_file: "../config.pbtxt"')))
    folder = write_python_model(
        tmp_path,
        "failing",
        FAILING_PY,
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\noutput [ { name: "Y" data_type: TYPE_INT32 '
        "dims: [ 1 ] } ]\n" + warmup_entry("boom", warmup_input("X", "INT32", "1", "random_data: true")),
    )
    assert folder.is_dir()
    models = ModelManager(ModelRepository(tmp_path, gpus=()))
    try:
        errors = await models.load_all()
        reasons = {row["name"]: row.get("reason", "") for row in models.index()}
        assert len(errors) == len(reasons) == 11
        assert not list(models.loaded())  # nothing half-warm serves
    finally:
        await models.close()
    expected = {
        "wrong_type": "warmup sample 'w', input 'INPUT0': data_type is INT32, the model takes FP32",
        "wrong_input": "warmup sample 'w': the model has no input 'NOPE' (inputs: INPUT0)",
        "no_input": "warmup sample 'w': gives no data for the model's required input(s) ['INPUT0']",
        "too_many_rows": "warmup sample 'w': batch_size 9 is over max_batch_size 8",
        "unbatched_rows": "warmup sample 'w': batch_size must be 1 for a model without batching, got 2",
        "open_dims": "warmup sample 'w', input 'INPUT0': dims [-1] must be fixed (no -1) in a warmup sample",
        "wrong_shape": "warmup sample 'w', input 'INPUT0': dims [15] do not fit the model's dims [16]",
        "no_file": "warmup sample 'w', input 'INPUT0': cannot read input_data_file ",
        "short_file": "warmup sample 'w', input 'INPUT0': input_data_file 'short.bin' has 60 bytes, the dims need "
        "64 (16 x FP32)",
        "escape": "input_data_file '../config.pbtxt' is outside the model's warmup/ folder",
        "failing": "warmup sample 'boom' failed: model 'failing' failed to execute the request: no warm welcome",
    }
    for name, words in expected.items():
        assert words in reasons[name], (name, reasons[name])
