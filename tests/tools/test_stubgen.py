"""``modelsvc stubgen``: typed model modules generated from a real server's metadata, checked by mypy --strict
(a correct user script passes, a wrong one fails where it is wrong), then imported and run."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest

from modelsvc.client import AsyncClient, Client, InvalidInput, ModelMetadata, TensorSpec
from modelsvc.tools.stubgen import class_name, python_names, render_stub
from tests._mypy import copy_of_the_projects_mypy_cache
from tests._server import ROOT, ModelsvcProcess, free_port

pytestmark = pytest.mark.integration

STUBS = {"add_sub": "add_sub_stub", "identity_bytes": "identity_bytes_stub", "token": "token_stub"}

# A model whose names are not Python identifiers, served by a mock transport (no server has one).
ODD = ModelMetadata(
    name="odd-model",
    versions=("1",),
    platform="custom",
    inputs=(
        TensorSpec("input-ids", "INT64", (-1, -1)),
        TensorSpec("in", "BYTES", (-1,)),
        TensorSpec("mask", "BOOL", (-1,), optional=True),
    ),
    outputs=(TensorSpec("out.0", "FP32", (-1, 2)), TensorSpec("count", "INT32", (-1,))),
)

GOOD = """\
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from add_sub_stub import AddSub, AddSubOutputs, AsyncAddSub
from identity_bytes_stub import IdentityBytes
from modelsvc.client import AsyncClient, Client
from odd_stub import OddModel, OddModelOutputs
from token_stub import Token


def run(url: str) -> dict[str, npt.NDArray[np.generic]]:
    with Client(url) as client:
        add_sub = AddSub(client)
        a = np.arange(32, dtype=np.float32).reshape(2, 16)
        out: AddSubOutputs = add_sub.infer(INPUT0=a, INPUT1=[[1.0] * 16, [2] * 16], timeout=10.0)
        total: npt.NDArray[np.float32] = out.OUTPUT0 + out.OUTPUT1
        words = IdentityBytes(client).infer(INPUT0=[["a", b"b", "naive", ""]]).OUTPUT0
        ids = np.array([[5, 6, 7]], np.int64)
        logits = Token(client).infer(input_ids=ids, attention_mask=np.ones_like(ids)).logits
        return {"sum": total, "minus": out.OUTPUT1, "words": words, "logits": logits}


async def run_async(url: str) -> npt.NDArray[np.float32]:
    async with AsyncClient(url) as client:
        add_sub = AsyncAddSub(client)
        one = np.ones((1, 16), np.float32)
        first = await add_sub.infer(INPUT0=one, INPUT1=one)
        second = await add_sub.infer(INPUT0=first.OUTPUT0, INPUT1=one)
        return second.OUTPUT0


def odd(client: Client) -> OddModelOutputs:
    return OddModel(client).infer(input_ids=[[1, 2]], in_=["x", b"y"], mask=np.array([True]))
"""

# each line marked ``# wrong`` must be an error; mypy must report nothing elsewhere
BAD = """\
from __future__ import annotations

import numpy as np

from add_sub_stub import AddSub
from identity_bytes_stub import IdentityBytes
from modelsvc.client import AsyncClient, Client


def wrong(client: Client, aclient: AsyncClient) -> None:
    ok = np.ones((1, 16), np.float32)
    ints = np.ones((1, 16), np.int64)  # (inline, numpy's overloads would let the context pick NDArray[Any])
    AddSub(client).infer(INPUT0=ints, INPUT1=ok)  # wrong: an INT64 array for FP32
    AddSub(client).infer(INPUT0=ok, INPUT2=ok)  # wrong: no input INPUT2 (and INPUT1 missing)
    text: str = AddSub(client).infer(INPUT0=ok, INPUT1=ok).OUTPUT0  # wrong: the output is an array
    IdentityBytes(client).infer(INPUT0=[[1, 2, 3, 4]])  # wrong: numbers for BYTES
    AddSub(aclient)  # wrong: the sync wrapper takes a Client
    AddSub(client).infer(INPUT0=[1.0] * 16, INPUT1=ok)  # wrong: rank 1 for a rank-2 input
"""


def _stubgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelsvc", "stubgen", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


# as for an installed package, mypy reads modelsvc's types but keeps its own findings to itself; warn_unreachable
# as in the project's config, whose cache (tests/_mypy.py) then serves for numpy, the standard library and the rest
MYPY_INI = """\
[mypy]
strict = True
warn_unreachable = True

[mypy-modelsvc.*]
follow_imports = silent
"""


def _mypy(folder: Path, script: str) -> subprocess.CompletedProcess[str]:
    (folder / "mypy.ini").write_text(MYPY_INI)
    if not (folder / ".mypy_cache").exists():
        copy_of_the_projects_mypy_cache(folder / ".mypy_cache")
    env = dict(os.environ, MYPYPATH=str(ROOT))  # the editable install's import hook is invisible to mypy
    command = [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir", ".mypy_cache", script]
    return subprocess.run(command, capture_output=True, text=True, cwd=folder, env=env, timeout=300)


def _odd_transport(seen: list[dict[str, Any]]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v2":
            return httpx.Response(200, json={"name": "mock", "extensions": []})
        if path == "/v2/models/odd-model/config":  # where optional inputs are marked
            return httpx.Response(200, json={"max_batch_size": 0, "input": [{"name": "mask", "optional": True}]})
        if path == "/v2/models/odd-model":
            specs = [
                [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in tensors]
                for tensors in (ODD.inputs, ODD.outputs)
            ]
            return httpx.Response(
                200, json={"name": "odd-model", "platform": "custom", "inputs": specs[0], "outputs": specs[1]}
            )
        if path == "/v2/models/odd-model/infer":
            body = json.loads(request.content)
            seen.append(body)
            rows = body["inputs"][0]["shape"][0]
            outputs = [
                {"name": "out.0", "datatype": "FP32", "shape": [rows, 2], "data": [0.5] * (2 * rows)},
                {"name": "count", "datatype": "INT32", "shape": [rows], "data": [len(body["inputs"])] * rows},
            ]
            return httpx.Response(200, json={"model_name": "odd-model", "outputs": outputs})
        return httpx.Response(404, json={"error": f"unexpected {path}"})

    return httpx.MockTransport(handle)


def _import(folder: Path, name: str) -> ModuleType:
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def stubs(server: ModelsvcProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("stubs")
    for model, module in STUBS.items():
        done = _stubgen("--url", server.url, "--model", model, "-o", str(folder / f"{module}.py"))
        assert done.returncode == 0, done.stderr
        assert f"wrote {folder / module}.py" in done.stderr
    (folder / "odd_stub.py").write_text(render_stub(ODD, url="http://mock", version=None))
    (folder / "good.py").write_text(GOOD)
    (folder / "bad.py").write_text(BAD)
    yield folder
    for name in [*STUBS.values(), "odd_stub", "good"]:
        sys.modules.pop(name, None)


def test_generated_module_reads_well(stubs: Path, server: ModelsvcProcess) -> None:
    source = (stubs / "add_sub_stub.py").read_text()
    assert source.startswith("# Generated by `modelsvc stubgen`")
    assert f'# server: "http://{server.url}"' in source
    assert '# model:  "add_sub", version: latest, platform: onnxruntime_onnx' in source
    assert '#   "INPUT0": FP32 [-1, 16]' in source
    assert "class AddSubOutputs(NamedTuple):" in source
    assert "    OUTPUT0: npt.NDArray[np.float32]" in source
    assert "        INPUT0: npt.NDArray[np.float32] | Sequence[Sequence[float]]," in source
    assert "class AsyncAddSub:" in source
    token = (stubs / "token_stub.py").read_text()
    assert "input_ids: npt.NDArray[np.int64] | Sequence[Sequence[int]]," in token
    words = (stubs / "identity_bytes_stub.py").read_text()
    assert "OUTPUT0: npt.NDArray[np.object_]" in words


def test_mypy_strict_accepts_correct_use(stubs: Path) -> None:
    done = _mypy(stubs, "good.py")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_rejects_wrong_use(stubs: Path) -> None:
    done = _mypy(stubs, "bad.py")
    assert done.returncode == 1, done.stdout + done.stderr
    wrong = {i for i, line in enumerate(BAD.splitlines(), 1) if "# wrong" in line}
    reported = {int(n) for n in re.findall(r"^bad\.py:(\d+): error", done.stdout, re.MULTILINE)}
    assert reported == wrong, done.stdout


def test_generated_wrappers_run_against_the_server(stubs: Path, server: ModelsvcProcess) -> None:
    good = _import(stubs, "good")
    out = good.run(server.url)
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    plus = np.array([[1.0] * 16, [2.0] * 16], np.float32)
    assert out["sum"].dtype == np.float32
    assert np.array_equal(out["sum"], (a + plus) + (a - plus))
    assert np.array_equal(out["minus"], a - plus)
    assert out["words"].tolist() == [[b"a", b"b", b"naive", b""]]
    assert out["logits"].shape == (1, 4)
    assert out["logits"].dtype == np.float32


async def test_async_wrapper_reads_metadata_once(stubs: Path, server: ModelsvcProcess) -> None:
    good = _import(stubs, "good")
    assert np.array_equal(await good.run_async(server.url), np.full((1, 16), 3.0, np.float32))
    stub = _import(stubs, "add_sub_stub")
    async with AsyncClient(server.url) as client:
        wrapper = stub.AsyncAddSub(client)
        loaded = await wrapper.load()
        assert await wrapper.load() is loaded
        with pytest.raises(InvalidInput, match="INPUT0"):  # the handle's local check, before sending
            await wrapper.infer(INPUT0=np.ones((1, 3), np.float32), INPUT1=np.ones((1, 16), np.float32))


def test_odd_names_are_mapped_and_wire_names_kept(stubs: Path) -> None:
    source = (stubs / "odd_stub.py").read_text()
    assert "input_ids: npt.NDArray[np.int64] | Sequence[Sequence[int]]," in source
    assert "in_: npt.NDArray[np.object_]" in source
    assert "mask: npt.NDArray[np.bool_] | Sequence[bool] | None = None," in source
    assert '        values["input-ids"] = input_ids' in source
    assert "    count_: npt.NDArray[np.int32]" in source
    good = _import(stubs, "good")
    seen: list[dict[str, Any]] = []
    with Client("http://mock", transport=_odd_transport(seen)) as client:
        out = good.odd(client)
        assert out.out_0.tolist() == [[0.5, 0.5]]
        assert out.count_.tolist() == [3]
        odd = _import(stubs, "odd_stub").OddModel(client)
        assert odd.infer(input_ids=[[1]], in_=["z"]).count_.tolist() == [2]  # the optional input left out
    assert [i["name"] for i in seen[0]["inputs"]] == ["input-ids", "in", "mask"]
    assert seen[0]["inputs"][1]["data"] == ["x", "y"]


def test_python_names() -> None:
    assert python_names(["input-ids", "in", "0", "_x", "x", "x", "match", "Ω", "timeout"], frozenset({"timeout"})) == [
        "input_ids",
        "in_",
        "t_0",
        "x",
        "x_2",
        "x_3",
        "match_",
        "t_",
        "timeout_",
    ]
    assert class_name("add_sub") == "AddSub"
    assert class_name("bert-base.onnx") == "BertBaseOnnx"
    assert class_name("3d") == "Model3d"
    assert class_name("model") == "ModelModel"  # would shadow modelsvc.client.Model
    assert class_name("client") == "ClientModel"


def test_hostile_names_cannot_break_out_of_the_module() -> None:
    meta = ModelMetadata(
        name='x"""\nimport os  # ',
        versions=(),
        platform="a\nb",
        inputs=(TensorSpec('in"\nput', "FP32\nimport os", (-1,)),),
        outputs=(TensorSpec("\\o", "BYTES", (2,)),),
    )
    source = render_stub(meta, url="http://h/\nimport os")
    compile(source, "stub.py", "exec")
    assert "\nimport os" not in source
    assert "npt.NDArray[Any] | Sequence[Any]" in source  # an unknown datatype is typed loosely


def test_unknown_model_is_named(server: ModelsvcProcess, tmp_path: Path) -> None:
    target = tmp_path / "nope.py"
    done = _stubgen("--url", server.url, "--model", "nope", "-o", str(target))
    assert done.returncode != 0
    assert "model 'nope' not found" in done.stderr
    assert server.url in done.stderr
    assert not target.exists()
    done = _stubgen("--url", server.url, "--model", "versioned", "--version", "9", "-o", str(target))
    assert done.returncode != 0
    assert "model 'versioned' version '9' not found" in done.stderr


def test_server_down_names_the_url(tmp_path: Path) -> None:
    url = f"127.0.0.1:{free_port()}"  # nothing listens there
    done = _stubgen("--url", url, "--model", "add_sub", "-o", str(tmp_path / "x.py"))
    assert done.returncode != 0
    assert f"cannot reach the server at http://{url}" in done.stderr
    assert "Traceback" not in done.stderr
