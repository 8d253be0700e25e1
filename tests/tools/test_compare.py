"""``modelsvc compare A B``: real ONNX Runtime sessions, a real ``modelsvc serve`` over HTTP and gRPC, and the
command in a subprocess for its exit statuses. The TensorRT plan runs only where TensorRT and a GPU are
(``-m gpu``); here its adapter is driven through a stand-in engine module."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelsvc._cli import main
from modelsvc.backends import ModelLoadError
from modelsvc.tools import onnx_models as om
from modelsvc.tools.compare import (
    CompareError,
    IncompatibleModels,
    OnnxRunner,
    PlanRunner,
    RunnerFailed,
    ServedRunner,
    SourceError,
    TensorDecl,
    UsageError,
    common_inputs,
    compare_runners,
    diff_output,
    load_npz,
    open_runner,
    parse_model_url,
    parse_shapes,
    random_feeds,
    render_table,
    resolve_shapes,
)
from modelsvc.tools.compare._plan import ENGINE_MODULE
from tests._server import ROOT, ModelsvcProcess, free_port

TOKEN_CONFIG = """name: "token"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
        { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def _token_model() -> onnx.ModelProto:
    return om.token_classifier(layers=1)


def _perturbed(model: onnx.ModelProto, scale: float = 1.01) -> onnx.ModelProto:
    """A copy whose classifier head weights are scaled by ``scale``."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for init in copy.graph.initializer:
        if init.name == "head_w":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(scale), "head_w"))
    return copy


def _int32_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph taking INT32 ids and mask (Gather and Cast accept both)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for value in copy.graph.input:
        value.type.tensor_type.elem_type = TensorProto.INT32
    onnx.checker.check_model(copy)
    return copy


def _add_only() -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1 (FP32 [batch, 16]): add_sub without OUTPUT1."""
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"])],
        "add_only",
        [helper.make_tensor_value_info(n, f, ["batch", 16]) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info("OUTPUT0", f, ["batch", 16])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", om.OPSET)], ir_version=8)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("compare")
    models = {
        "token": _token_model(),
        "perturbed": _perturbed(_token_model()),
        "token32": _int32_inputs(_token_model()),
        "add_sub": om.add_sub(),
        "add_only": _add_only(),
        "three_labels": om.token_classifier(layers=1, labels=3),
    }
    paths = {}
    for name, model in models.items():
        paths[name] = folder / f"{name}.onnx"
        onnx.save(model, str(paths[name]))
    return paths


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelsvcProcess]:
    repo = tmp_path_factory.mktemp("compare-repo")
    om.write_model(repo, "token", _token_model(), TOKEN_CONFIG)
    with ModelsvcProcess(repo) as proc:
        yield proc


def _compare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelsvc", "compare", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def _feeds(a: OnnxRunner | ServedRunner, b: OnnxRunner | ServedRunner, **kw: Any) -> dict[str, Any]:
    inputs, _ = common_inputs(a.inputs, b.inputs)
    return random_feeds(inputs, **kw)


# --- ONNX against ONNX ------------------------------------------------------------------------------------------


def test_onnx_against_itself_differs_by_nothing(files: dict[str, Path]) -> None:
    a, b = OnnxRunner(files["token"]), OnnxRunner(files["token"])
    assert a.inputs == [TensorDecl("input_ids", "INT64", (-1, -1)), TensorDecl("attention_mask", "INT64", (-1, -1))]
    assert a.outputs == ["logits"]
    report = compare_runners(a, b, _feeds(a, b, seed=3), atol=0.0, rtol=0.0)
    assert report.passed
    assert report.failed == ()
    [diff] = report.outputs
    assert (diff.name, diff.shape_a, diff.max_abs, diff.max_rel, diff.verdict) == ("logits", (2, 4), 0.0, 0.0, "ok")
    a.close()
    b.close()


def test_perturbed_copy_is_over_and_the_numbers_are_the_real_ones(files: dict[str, Path]) -> None:
    a, b = OnnxRunner(files["perturbed"]), OnnxRunner(files["token"])
    feeds = _feeds(a, b, seed=0)
    report = compare_runners(a, b, feeds, atol=1e-6, rtol=1e-6)
    reference = b.run(feeds)["logits"].astype(np.float64)
    [diff] = report.outputs
    # head_w scaled by 1.01 and head_b zero: A's logits are 1.01 x B's
    assert diff.max_abs == pytest.approx(np.abs(0.01 * reference).max(), rel=1e-3)
    assert diff.max_rel == pytest.approx(0.01, rel=1e-3)
    assert not report.passed
    assert report.failed == ("logits",)
    assert diff.verdict == "OVER"
    # and within a tolerance that covers 1 %: allclose's rule, atol + rtol * |b|
    assert compare_runners(a, b, feeds, atol=0.0, rtol=0.0101).passed
    assert not compare_runners(a, b, feeds, atol=0.0, rtol=0.0099).passed


def test_cli_exit_statuses_and_table(files: dict[str, Path]) -> None:
    same = _compare(str(files["token"]), str(files["token"]), "--seed", "5")
    assert same.returncode == 0, same.stderr
    assert "logits  2x4    0        0        ok" in same.stdout
    assert "inputs (random, seed 5): input_ids 2x16 int64, attention_mask 2x16 int64" in same.stdout

    over = _compare(str(files["perturbed"]), str(files["token"]), "--shape", "input_ids:3x9")
    assert over.returncode == 1, over.stderr
    line = next(li for li in over.stdout.splitlines() if li.startswith("logits"))
    assert line.split()[1] == "3x4"
    assert line.split()[-1] == "OVER"
    assert "FAILED: logits" in over.stdout
    # the same pair within a loose tolerance
    loose = _compare(str(files["perturbed"]), str(files["token"]), "--atol", "1", "--rtol", "0.02")
    assert loose.returncode == 0, loose.stdout + loose.stderr


# --- inputs --------------------------------------------------------------------------------------------------------

TOKEN_INPUTS = [TensorDecl("input_ids", "INT64", (-1, -1)), TensorDecl("attention_mask", "INT64", (-1, -1))]


def test_shape_specs() -> None:
    assert parse_shapes(["input_ids:2x128", "a:1,b:3x4"]) == {"input_ids": (2, 128), "a": (1,), "b": (3, 4)}
    assert parse_shapes(["odd:name:2"]) == {"odd:name": (2,)}
    for bad, words in [
        ("input_ids", "expected NAME:AxB"),
        ("input_ids:2xa", "not whole numbers"),
        ("input_ids:2x0", "at least 1"),
        (":2", "expected NAME:AxB"),
    ]:
        with pytest.raises(UsageError, match=words):
            parse_shapes([bad])
    with pytest.raises(UsageError, match="'x' is given twice"):
        parse_shapes(["x:1", "x:2"])


def test_free_dims_follow_the_rules() -> None:
    assert resolve_shapes(TOKEN_INPUTS, {}) == {"input_ids": (2, 16), "attention_mask": (2, 16)}
    # a --shape sizes the other inputs of its rank
    assert resolve_shapes(TOKEN_INPUTS, {"input_ids": (4, 128)}) == {"input_ids": (4, 128), "attention_mask": (4, 128)}
    fixed = [TensorDecl("x", "FP32", (-1, 3, -1)), TensorDecl("y", "FP32", (7,))]
    assert resolve_shapes(fixed, {}) == {"x": (2, 3, 16), "y": (7,)}
    with pytest.raises(UsageError, match=r"shape \[2, 4, 5\] does not fit input x's dims \[-1, 3, -1\]"):
        resolve_shapes(fixed, {"x": (2, 4, 5)})
    with pytest.raises(UsageError, match="does not fit"):
        resolve_shapes(fixed, {"y": (7, 1)})
    with pytest.raises(UsageError, match="--shape names z, not an input; the inputs are x, y"):
        resolve_shapes(fixed, {"z": (1,)})


def test_random_values_are_seeded_and_follow_the_names() -> None:
    inputs = [*TOKEN_INPUTS, TensorDecl("token_type_ids", "INT32", (-1, -1)), TensorDecl("x", "FP16", (3,))]
    one, two = random_feeds(inputs, seed=1), random_feeds(inputs, seed=1)
    assert all(np.array_equal(one[n], two[n]) for n in one)
    assert not np.array_equal(random_feeds(inputs, seed=2)["input_ids"], one["input_ids"])
    assert one["input_ids"].dtype == np.int64
    assert one["input_ids"].min() >= 0
    assert one["input_ids"].max() < 100
    assert one["attention_mask"].dtype == np.int64
    assert (one["attention_mask"] == 1).all()
    assert one["token_type_ids"].dtype == np.int32
    assert (one["token_type_ids"] == 0).all()
    assert one["x"].dtype == np.float16
    assert one["x"].shape == (3,)
    with pytest.raises(UsageError, match=r"input s is BYTES.*--npz"):
        random_feeds([TensorDecl("s", "BYTES", (1,))])


def test_npz_inputs(files: dict[str, Path], tmp_path: Path) -> None:
    ids = np.array([[5, 6, 7, 8]], np.int32)
    mask = np.array([[1, 1, 1, 0]], np.int64)
    good = tmp_path / "good.npz"
    np.savez(good, input_ids=ids, attention_mask=mask)
    feeds, notes = load_npz(good, TOKEN_INPUTS)
    assert feeds["input_ids"].dtype == np.int64
    assert feeds["input_ids"].tolist() == ids.tolist()
    assert notes == ["--npz: input_ids cast from int32 to int64"]
    a, b = OnnxRunner(files["token"]), OnnxRunner(files["token"])
    assert compare_runners(a, b, feeds, 0.0, 0.0).outputs[0].shape_a == (1, 4)

    run = _compare(str(files["perturbed"]), str(files["token"]), "--npz", str(good))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "logits  1x4" in run.stdout
    assert f"inputs (from {good})" in run.stdout

    extra = tmp_path / "extra.npz"
    np.savez(extra, input_ids=ids, token_type_ids=ids)
    with pytest.raises(UsageError, match="missing attention_mask; extra token_type_ids"):
        load_npz(extra, TOKEN_INPUTS)
    status = _compare(str(files["token"]), str(files["token"]), "--npz", str(extra))
    assert status.returncode == 2
    assert "missing attention_mask; extra token_type_ids" in status.stderr

    floats = tmp_path / "floats.npz"
    np.savez(floats, input_ids=ids.astype(np.float32), attention_mask=mask)
    with pytest.raises(UsageError, match="input_ids is float32, input input_ids is INT64"):
        load_npz(floats, TOKEN_INPUTS)
    rank = tmp_path / "rank.npz"
    np.savez(rank, input_ids=ids[0], attention_mask=mask)
    with pytest.raises(UsageError, match=r"shape \[4\] does not fit input input_ids's dims \[-1, -1\]"):
        load_npz(rank, TOKEN_INPUTS)
    with pytest.raises(UsageError, match="no such file"):
        load_npz(tmp_path / "absent.npz", TOKEN_INPUTS)
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(UsageError, match=r"not a readable \.npz"):
        load_npz(tmp_path / "junk.npz", TOKEN_INPUTS)
    both = _compare(str(files["token"]), str(files["token"]), "--npz", str(good), "--shape", "input_ids:1x2")
    assert both.returncode == 2
    assert "exclude each other" in both.stderr


def test_int32_side_against_int64_side_is_cast_and_said(files: dict[str, Path]) -> None:
    a, b = OnnxRunner(files["token"]), OnnxRunner(files["token32"])
    assert [t.datatype for t in b.inputs] == ["INT32", "INT32"]
    inputs, notes = common_inputs(a.inputs, b.inputs)
    assert [t.datatype for t in inputs] == ["INT64", "INT64"]
    assert notes[0] == "input input_ids: INT64 in A, INT32 in B; B gets it cast to INT32"
    report = compare_runners(a, b, random_feeds(inputs), 0.0, 0.0)
    assert report.passed
    assert report.notes == tuple(notes)
    run = _compare(str(files["token32"]), str(files["token"]))
    assert run.returncode == 0, run.stderr
    assert "input attention_mask: INT32 in A, INT64 in B; B gets it cast to INT64" in run.stderr


def test_models_that_take_other_inputs_or_give_other_outputs(files: dict[str, Path]) -> None:
    token, add_sub = OnnxRunner(files["token"]), OnnxRunner(files["add_sub"])
    with pytest.raises(IncompatibleModels, match="only A takes input_ids, attention_mask; only B takes INPUT0, INPUT1"):
        common_inputs(token.inputs, add_sub.inputs)
    run = _compare(str(files["token"]), str(files["add_sub"]))
    assert run.returncode == 1
    assert "only A takes input_ids" in run.stderr
    with pytest.raises(IncompatibleModels, match="datatype FP32 in A, INT64 in B"):
        common_inputs([TensorDecl("x", "FP32", (2,))], [TensorDecl("x", "INT64", (2,))])
    with pytest.raises(IncompatibleModels, match=r"input x: dims \[2, 3\] in A, \[2, 4\] in B"):
        common_inputs([TensorDecl("x", "FP32", (2, 3))], [TensorDecl("x", "FP32", (2, 4))])
    merged, _ = common_inputs([TensorDecl("x", "FP32", (-1, 3))], [TensorDecl("x", "FP32", (2, -1))])
    assert merged == [TensorDecl("x", "FP32", (2, 3))]

    # add_only gives OUTPUT0 = INPUT0 + INPUT1 only; add_sub gives OUTPUT0 and OUTPUT1
    add_only = OnnxRunner(files["add_only"])
    feeds = random_feeds(add_only.inputs, seed=0)
    report = compare_runners(add_only, add_sub, feeds, 0.0, 0.0)
    assert [(d.name, d.max_abs, d.passed) for d in report.outputs] == [("OUTPUT0", 0.0, True)]
    assert report.only_b == ("OUTPUT1",)
    with pytest.raises(UsageError, match="--outputs names OUTPUT1, not an output of both models"):
        compare_runners(add_only, add_sub, feeds, 0.0, 0.0, outputs=["OUTPUT1"])
    narrowed = _compare(str(files["add_sub"]), str(files["add_only"]), "--outputs", "OUTPUT0")
    assert narrowed.returncode == 0, narrowed.stderr
    assert "only A gives (not compared): OUTPUT1" in narrowed.stdout
    assert _compare(str(files["add_sub"]), str(files["add_only"]), "--outputs", "OUTPUT1").returncode == 2


def test_differences_by_definition() -> None:
    b = np.array([0.0, 1.0, -2.0, 100.0], np.float32)
    a = np.array([1e-7, 1.001, -2.0, 101.0], np.float32)
    d = diff_output("y", a, b, atol=1e-3, rtol=1e-2)
    assert d.max_abs == pytest.approx(1.0, rel=1e-6)
    # 1e-7 over the floor 1e-6 is 0.1; 1 over 100 is 0.01; 0.001 over 1 is 0.001
    assert d.max_rel == pytest.approx(0.1, rel=1e-3)
    assert d.passed  # every element within 1e-3 + 1e-2 * |b|
    assert not diff_output("y", a, b, atol=1e-3, rtol=5e-3).passed  # 1 > 1e-3 + 0.5
    nan = diff_output("y", np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), 0.0, 0.0)
    assert (nan.passed, nan.max_abs) == (True, 0.0)
    one_nan = diff_output("y", np.array([np.nan, 1.0]), np.array([0.0, 1.0]), 1.0, 1.0)
    assert (one_nan.passed, one_nan.max_abs, one_nan.max_rel) == (False, np.inf, np.inf)
    shape = diff_output("y", np.zeros((2, 3)), np.zeros((2, 4)), 1.0, 1.0)
    assert (shape.passed, shape.verdict, shape.shapes_match) == (False, "SHAPE", False)
    words = diff_output("w", np.array([b"a", b"b"], object), np.array([b"a", b"c"], object), 1.0, 1.0)
    assert (words.passed, words.max_abs) == (False, np.inf)
    assert diff_output("w", np.array([b"a"], object), np.array([b"a"], object), 0.0, 0.0).passed


def test_output_of_another_shape_fails_naming_it(files: dict[str, Path]) -> None:
    a, b = OnnxRunner(files["token"]), OnnxRunner(files["three_labels"])
    report = compare_runners(a, b, random_feeds(a.inputs), 1.0, 1.0)
    assert not report.passed
    assert report.failed == ("logits",)
    assert "logits  2x4 vs 2x3  -        -        SHAPE" in render_table(report)
    run = _compare(str(files["token"]), str(files["three_labels"]))
    assert run.returncode == 1
    assert "SHAPE" in run.stdout


def test_a_model_that_fails_on_the_inputs_is_named(files: dict[str, Path]) -> None:
    a = OnnxRunner(files["token"])
    with pytest.raises(RunnerFailed, match=r"token\.onnx: ONNX Runtime failed"):
        a.run({"input_ids": np.zeros((1, 2), np.int64)})  # attention_mask missing


# --- sources -------------------------------------------------------------------------------------------------------


def test_bad_sources(files: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    cases = [
        (str(tmp_path / "notes.txt"), "not a model source; expected a file ending in .onnx, .plan, .engine"),
        (str(tmp_path / "absent.onnx"), "absent.onnx: no such file"),
        (str(tmp_path / "broken.onnx"), "broken.onnx: ONNX Runtime cannot load it"),
        (str(tmp_path / "absent.plan"), "absent.plan: no such file"),
        ("ftp://host:1/v2/models/m", "starts with http://, https:// or grpc://"),
        ("http://127.0.0.1:1/models/m", "expected http://HOST:PORT/v2/models/NAME"),
        (f"http://127.0.0.1:{free_port()}/v2/models/m", "cannot reach the server"),
    ]
    for source, words in cases:
        with pytest.raises(SourceError, match=words):
            open_runner(source)
        run = _compare(source, str(files["token"]))
        assert run.returncode == 2, (source, run.stdout, run.stderr)
        assert words.split(":")[-1].strip() in run.stderr


def test_model_urls() -> None:
    assert parse_model_url("http://h:8000/v2/models/m") == ("http://h:8000", "m", None)
    assert parse_model_url("GRPC://h:8001/v2/models/m/versions/3/") == ("grpc://h:8001", "m", "3")
    assert parse_model_url("https://h/v2/models/m") == ("https://h", "m", None)
    with pytest.raises(SourceError):
        parse_model_url("http://h:8000/v2/models/m/versions")


# --- served models ---------------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_onnx_against_the_served_model(served: ModelsvcProcess, files: dict[str, Path], scheme: str) -> None:
    port = served.http_port if scheme == "http" else served.grpc_port
    url = f"{scheme}://127.0.0.1:{port}/v2/models/token"
    b = ServedRunner(url)
    assert b.inputs == [TensorDecl("input_ids", "INT64", (-1, -1)), TensorDecl("attention_mask", "INT64", (-1, -1))]
    assert b.outputs == ["logits"]
    a = OnnxRunner(files["token"])
    report = compare_runners(a, b, random_feeds(a.inputs, {"input_ids": (3, 11)}, seed=4), atol=1e-6, rtol=1e-5)
    assert report.passed
    assert report.outputs[0].shape_a == (3, 4)
    b.close()

    run = _compare(str(files["token"]), url + "/versions/1", "--shape", "input_ids:4x20", "--atol", "1e-6")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "logits  4x4" in run.stdout
    over = _compare(url, str(files["perturbed"]))
    assert over.returncode == 1, over.stdout + over.stderr
    assert "OVER" in over.stdout


@pytest.mark.integration
def test_served_errors(served: ModelsvcProcess) -> None:
    base = f"http://127.0.0.1:{served.http_port}/v2/models"
    with pytest.raises(SourceError, match="no model 'absent'"):
        ServedRunner(f"{base}/absent")
    with pytest.raises(SourceError, match="no model 'token' version 9"):
        ServedRunner(f"{base}/token/versions/9")
    runner = ServedRunner(f"{base}/token")
    with pytest.raises(RunnerFailed, match="inference on 'token' failed"):
        runner.run({"input_ids": np.zeros((1, 3), np.int64)})  # attention_mask missing: a 400
    runner.close()
    run = _compare(f"{base}/absent", f"{base}/token")
    assert run.returncode == 2
    assert "no model 'absent'" in run.stderr


# --- TensorRT plans ------------------------------------------------------------------------------------------------


@dataclass
class _Tensor:
    name: str
    is_input: bool
    datatype: str
    dims: tuple[int, ...]


class _StandInEngine:
    """Stands in for modelsvc.backends.tensorrt._tensorrt_engine.PlanEngine (constructor, description, infer,
    close). Its "plan" is the path of an ONNX file with INT32 inputs, which it runs in ONNX Runtime; one profile,
    opt 3x8."""

    made: ClassVar[list[tuple[bytes, int, int]]] = []

    def __init__(self, plan: bytes, *, device: int = 0, profile: int = 0) -> None:
        self.made.append((plan, device, profile))
        self.onnx = OnnxRunner(plan.decode())
        limits = ((1, 1), (3, 8), (8, 64))
        self.description = types.SimpleNamespace(
            tensors=[
                _Tensor("input_ids", True, "TYPE_INT32", (-1, -1)),
                _Tensor("attention_mask", True, "TYPE_INT32", (-1, -1)),
                _Tensor("logits", False, "TYPE_FP32", (-1, 4)),
            ],
            profiles=[types.SimpleNamespace(shapes={"input_ids": limits, "attention_mask": limits})],
        )

    def infer(self, feeds: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        assert all(v.dtype == np.int32 for v in feeds.values())
        return self.onnx.run(feeds)

    def close(self) -> None:
        self.onnx.close()


def _stand_in(monkeypatch: pytest.MonkeyPatch, engine: type) -> None:
    module = types.ModuleType(ENGINE_MODULE)
    module.PlanEngine = engine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, ENGINE_MODULE, module)


def test_plan_runner_adapts_the_engine(
    monkeypatch: pytest.MonkeyPatch, files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _stand_in(monkeypatch, _StandInEngine)
    plan = tmp_path / "m.plan"
    plan.write_bytes(str(files["token32"]).encode())
    runner = open_runner(str(plan))
    assert isinstance(runner, PlanRunner)
    assert _StandInEngine.made[-1] == (str(files["token32"]).encode(), 0, 0)
    assert runner.inputs == [
        TensorDecl("input_ids", "INT32", (-1, -1)),
        TensorDecl("attention_mask", "INT32", (-1, -1)),
    ]
    assert runner.outputs == ["logits"]
    assert runner.opt_shapes == {"input_ids": (3, 8), "attention_mask": (3, 8)}
    # an INT64 ONNX side against this INT32 "plan": cast for the plan, no difference
    onnx_side = OnnxRunner(files["token"])
    inputs, notes = common_inputs(onnx_side.inputs, runner.inputs)
    report = compare_runners(onnx_side, runner, random_feeds(inputs), 0.0, 0.0)
    assert report.passed
    assert len(notes) == 2
    runner.close()
    PlanRunner(str(files["token32"]).encode(), device=1, profile=2).close()
    assert _StandInEngine.made[-1][1:] == (1, 2)

    # the command line, in process (the stand-in lives in this process): the profile's opt shapes are fed
    assert main(["compare", str(files["perturbed"]), str(plan)]) == 1
    out, err = capsys.readouterr()
    assert "input_ids 3x8 int64, attention_mask 3x8 int64" in out
    assert "logits  3x4" in out
    assert "opt shapes of the plan's optimization profile" in err
    assert main(["compare", str(files["token"]), str(plan), "--shape", "input_ids:5x9"]) == 0
    assert "input_ids 5x9 int64, attention_mask 5x9 int64" in capsys.readouterr().out


def test_plan_runner_without_tensorrt_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        import tensorrt  # noqa: F401
    except ImportError:  # the real engine module, whose import of tensorrt fails here
        with pytest.raises(SourceError, match=r"needs TensorRT: pip install 'modelsvc\[tensorrt\]'"):
            PlanRunner(b"PLAN")

    class NeedsTensorrt:
        def __init__(self, plan: bytes, *, device: int = 0, profile: int = 0) -> None:
            raise ModuleNotFoundError("No module named 'tensorrt'", name="tensorrt")

    class NotAPlan:
        def __init__(self, plan: bytes, *, device: int = 0, profile: int = 0) -> None:
            raise ModelLoadError("TensorRT 10.9 cannot read this plan (built for compute capability 8.0)")

    _stand_in(monkeypatch, NeedsTensorrt)
    with pytest.raises(SourceError, match=r"needs TensorRT: pip install 'modelsvc\[tensorrt\]'"):
        PlanRunner(b"PLAN")
    _stand_in(monkeypatch, NotAPlan)
    with pytest.raises(SourceError, match=r"<plan of 4 bytes>: TensorRT 10\.9 cannot read this plan"):
        PlanRunner(b"PLAN")


def _build_plan(onnx_path: Path) -> bytes:
    """A plan of the ONNX model with one profile (batch 1..8, sequence 1..64), through TensorRT's own API."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        raise RuntimeError("; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
    config = builder.create_builder_config()
    if getattr(trt.BuilderFlag, "TF32", None) is not None:  # on by default; the test compares at 1e-4
        config.clear_flag(trt.BuilderFlag.TF32)
    profile = builder.create_optimization_profile()
    for name in ("input_ids", "attention_mask"):
        profile.set_shape(name, (1, 1), (2, 16), (8, 64))
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT built no engine")
    return bytes(serialized)


@pytest.mark.gpu
def test_plan_against_onnx_on_a_gpu(files: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("tensorrt", reason="TensorRT is not installed (pip install 'modelsvc[tensorrt]')")
    if subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode != 0:
        pytest.skip("no NVIDIA GPU (nvidia-smi -L fails)")
    plan = tmp_path / "token.plan"
    plan.write_bytes(_build_plan(files["token"]))
    runner = PlanRunner(plan)
    assert [t.name for t in runner.inputs] == ["input_ids", "attention_mask"]
    assert runner.outputs == ["logits"]
    a = OnnxRunner(files["token"])
    inputs, _ = common_inputs(a.inputs, runner.inputs)
    report = compare_runners(a, runner, random_feeds(inputs, {"input_ids": (4, 32)}), atol=1e-4, rtol=1e-3)
    assert report.passed, render_table(report)
    runner.close()
    run = _compare(str(files["token"]), str(plan), "--atol", "1e-4")
    assert run.returncode == 0, run.stdout + run.stderr
    over = _compare(str(files["perturbed"]), str(plan))
    assert over.returncode == 1
    assert "OVER" in over.stdout


def test_errors_are_one_tree() -> None:
    assert issubclass(SourceError, UsageError)
    assert issubclass(UsageError, CompareError)
    assert (CompareError.exit_status, UsageError.exit_status, SourceError.exit_status) == (1, 2, 2)
    assert IncompatibleModels.exit_status == RunnerFailed.exit_status == 1
