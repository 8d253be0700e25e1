"""loadtests/gpu: what can be checked without a GPU.

- verify.sh parses (``bash -n``), passes shellcheck where it is installed, and refuses to run where it cannot:
  no nvidia-smi, an nvidia-smi that fails (no driver), no wheel folder; ``--list`` names its steps without a GPU;
  an unknown step is a usage error; a step that passed is skipped on the next run (``--force`` runs it again),
  the default run stops before a step the budget cannot cover (exit 3); its step machinery stops on a failing
  step with the step's name and log, and on a step that runs past the budget;
- bench_gpu's pure parts: the FLOPs of a BERT encoder and the bound they give, the peak table by GPU name, the
  model spec, the concurrency and time per cell, the measuring loops on fake calls, and the table's text.

The GPU steps themselves (TensorRT, ONNX Runtime CUDA, the served plan) run only on a GPU machine.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadtests.gpu import bench_gpu as bench

ROOT = Path(__file__).resolve().parents[2]
VERIFY = ROOT / "loadtests" / "gpu" / "verify.sh"
BASH = shutil.which("bash") or "/bin/bash"


# --- verify.sh ----------------------------------------------------------------------------------------------


def _tool(folder: Path, name: str, script: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _bin(tmp_path: Path, *, nvidia_smi: str | None) -> Path:
    """A PATH folder with the few tools verify.sh uses before its first step, and nvidia-smi as given."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("dirname", "sed", "timeout", "tail", "mkdir", "printf", "sleep", "cat", "date"):
        found = shutil.which(tool)
        if found:
            (folder / tool).symlink_to(found)
    if nvidia_smi is not None:
        _tool(folder, "nvidia-smi", nvidia_smi)
    return folder


def _verify(tmp_path: Path, bin_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {"PATH": str(bin_dir), "HOME": str(tmp_path), "TMPDIR": str(tmp_path), **env}
    return subprocess.run(
        [BASH, str(VERIFY), *args], capture_output=True, text=True, timeout=60, env=environment, cwd=tmp_path
    )


WORKING_SMI = 'echo "NVIDIA H100 80GB HBM3, 570.86.15, 81559 MiB, 9.0"\n'


def test_the_script_parses() -> None:
    done = subprocess.run([BASH, "-n", str(VERIFY)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert os.access(VERIFY, os.X_OK)


def test_shellcheck_finds_nothing() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    done = subprocess.run([shellcheck, "-x", str(VERIFY)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_without_nvidia_smi_it_says_there_is_no_gpu(tmp_path: Path) -> None:
    done = _verify(tmp_path, _bin(tmp_path, nvidia_smi=None), "--wheels", str(tmp_path))
    assert done.returncode == 2
    assert "verify.sh: no NVIDIA GPU here: nvidia-smi is not on PATH" in done.stderr
    assert done.stdout == ""


def test_on_this_machine_it_stops_at_the_gpu_check(tmp_path: Path) -> None:
    """With the machine's own PATH: where nvidia-smi is missing or fails, the same clear refusal."""
    environment = {**os.environ, "TMPDIR": str(tmp_path)}
    environment.pop("WHEELS", None)
    done = subprocess.run([BASH, str(VERIFY)], capture_output=True, text=True, timeout=60, env=environment)
    smi = shutil.which("nvidia-smi")
    if smi is not None and subprocess.run([smi], capture_output=True, timeout=30).returncode == 0:
        pytest.skip("this machine has a working NVIDIA GPU")
    assert done.returncode == 2
    assert re.search(r"verify\.sh: no (usable )?NVIDIA GPU", done.stderr), done.stderr


def test_a_failing_nvidia_smi_is_no_gpu_with_its_reason(tmp_path: Path) -> None:
    smi = 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver." >&2\nexit 9\n'
    done = _verify(tmp_path, _bin(tmp_path, nvidia_smi=smi), "--wheels", str(tmp_path))
    assert done.returncode == 2
    assert "verify.sh: no usable NVIDIA GPU: nvidia-smi failed: NVIDIA-SMI has failed because" in done.stderr


@pytest.mark.parametrize(
    ("wheels", "message"),
    [
        (None, "no wheel folder: give --wheels DIR or WHEELS=DIR"),
        ("missing", "does not exist"),
        ("empty", "holds no .whl file"),
    ],
)
def test_the_wheel_folder_is_required(tmp_path: Path, wheels: str | None, message: str) -> None:
    (tmp_path / "empty").mkdir()
    args = [] if wheels is None else ["--wheels", str(tmp_path / wheels)]
    done = _verify(tmp_path, _bin(tmp_path, nvidia_smi=WORKING_SMI), *args)
    assert done.returncode == 2
    assert message in done.stderr


def test_usage_and_bad_arguments(tmp_path: Path) -> None:
    bin_dir = _bin(tmp_path, nvidia_smi=None)
    shown = _verify(tmp_path, bin_dir, "--help")
    assert shown.returncode == 0
    assert "--wheels DIR" in shown.stdout
    assert "--peak-tflops" in shown.stdout
    bad = _verify(tmp_path, bin_dir, "--wheel", "x")
    assert bad.returncode == 2
    assert "unknown argument: --wheel" in bad.stderr
    bad = _verify(tmp_path, bin_dir, "--budget-s", "ten")
    assert bad.returncode == 2
    assert "--budget-s must be whole seconds" in bad.stderr


def _fake_setup(tmp_path: Path, pip_script: str) -> tuple[Path, Path, Path]:
    """A working fake nvidia-smi, a wheel folder with one wheel, and a venv whose pip is ``pip_script``."""
    bin_dir = _bin(tmp_path, nvidia_smi=WORKING_SMI)
    (bin_dir / "python3").symlink_to(sys.executable)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "setuptools-80.0.0-py3-none-any.whl").write_bytes(b"")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    _tool(venv / "bin", "pip", pip_script)
    return bin_dir, wheels, venv


def test_a_failing_step_stops_with_its_name_and_log(tmp_path: Path) -> None:
    pip = 'echo "ERROR: No matching distribution found for setuptools>=77" >&2\nexit 3\n'
    bin_dir, wheels, venv = _fake_setup(tmp_path, pip)
    out = tmp_path / "out"
    done = _verify(tmp_path, bin_dir, "--wheels", str(wheels), "--venv", str(venv), "--out", str(out))
    assert done.returncode == 1
    assert "verify.sh: GPU 0: NVIDIA H100 80GB HBM3, 570.86.15, 81559 MiB, 9.0" in done.stdout
    assert re.search(r"install-setuptools\s+FAILED", done.stdout)
    assert "No matching distribution found for setuptools>=77" in done.stderr  # the log's tail
    log = out / "logs" / "setup-install-setuptools.log"
    assert f"step 'setup': 'install-setuptools' failed with exit status 3 (log: {log})" in done.stderr
    assert "No matching distribution" in log.read_text()
    assert not (out / "passed" / "setup").exists()


def test_a_step_past_the_budget_is_stopped(tmp_path: Path) -> None:
    bin_dir, wheels, venv = _fake_setup(tmp_path, "sleep 30\n")
    args = ["setup", "--wheels", str(wheels), "--venv", str(venv), "--out", str(tmp_path / "out"), "--budget-s", "2"]
    done = _verify(tmp_path, bin_dir, *args)
    assert done.returncode == 1
    assert re.search(r"step 'setup': 'install-setuptools' ran past its [12]s", done.stderr), done.stderr


STEPS = ["setup", "export", "build", "compare", "test", "serve", "bench", "padding", "ingest"]


def test_list_names_the_steps_without_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "passed").mkdir(parents=True)
    (out / "passed" / "export").write_text("181 s, 2026-11-28T10:00Z\n")
    done = _verify(tmp_path, _bin(tmp_path, nvidia_smi=None), "--list", "--out", str(out), "--bench-s", "100")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == STEPS
    assert re.match(r"setup\s+4-6 min\s+limit  540s  not passed$", lines[0]), lines[0]
    assert lines[1].endswith("passed (181 s, 2026-11-28T10:00Z)")
    assert "limit  340s" in lines[6]  # the bench's limit follows --bench-s
    assert all(int(re.search(r"limit\s+(\d+)s", line)[1]) <= 540 for line in lines)  # each fits a 10-minute run


def test_an_unknown_step_is_a_usage_error(tmp_path: Path) -> None:
    done = _verify(tmp_path, _bin(tmp_path, nvidia_smi=WORKING_SMI), "setup", "compile")
    assert done.returncode == 2
    assert "unknown step 'compile' (the steps: setup export build compare test serve bench padding ingest)" in (
        done.stderr
    )
    assert _verify(tmp_path, tmp_path / "bin", "--step").returncode != 0


def _stubbed(tmp_path: Path) -> Path:
    """verify.sh sourced, with every step's body replaced by one that notes it ran in OUT/ran."""
    wrapper = tmp_path / "stubbed.sh"
    stubs = "".join(f'step_{s}() {{ echo {s} >>"$OUT/ran"; }}\n' for s in STEPS)
    wrapper.write_text(f'source "{VERIFY}"\n{stubs}main "$@"\n')
    return wrapper


def test_a_step_that_passed_is_not_run_again(tmp_path: Path) -> None:
    bin_dir = _bin(tmp_path, nvidia_smi=WORKING_SMI)
    wrapper, out = _stubbed(tmp_path), tmp_path / "out"
    environment = {"PATH": str(bin_dir), "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}

    def verify(*args: str) -> subprocess.CompletedProcess[str]:
        command = [BASH, str(wrapper), "--out", str(out), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=environment, cwd=tmp_path)

    done = verify("export", "--step", "build")
    assert done.returncode == 0, done.stderr
    assert (out / "ran").read_text().split() == ["export", "build"]
    assert sorted(p.name for p in (out / "passed").iterdir()) == ["build", "export"]
    assert "verify.sh: export build: every step passed" in done.stdout

    done = verify("build", "compare")
    assert done.returncode == 0, done.stderr
    assert re.search(r"build\s+passed earlier \(\d+ s, ", done.stdout)
    assert (out / "ran").read_text().split() == ["export", "build", "compare"]
    verify("build", "--force")
    assert (out / "ran").read_text().split() == ["export", "build", "compare", "build"]

    # the default run: the next steps not passed, until one would not fit in the budget
    done = verify("--budget-s", "400")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "the next step, setup, needs up to 540s; 400s of the budget are left: run verify.sh again" in done.stdout
    (out / "passed" / "setup").write_text("1 s\n")
    done = verify("--bench-s", "30")
    assert done.returncode == 0, done.stderr
    assert (out / "ran").read_text().split()[4:] == ["test", "serve", "bench", "padding", "ingest"]


# --- bench_gpu: the FLOP bound ------------------------------------------------------------------------------
# --- bench_gpu: the FLOP bound ------------------------------------------------------------------------------


def test_encoder_params_of_known_models() -> None:
    # BERT-base's encoder: 85.05 M of its 109.5 M weights (the rest: embeddings and pooler)
    assert bench.encoder_params(12, 768) == 85_054_464
    assert bench.encoder_params(12, 768, 3072) == 85_054_464
    # all-MiniLM-L6-v2: 6 layers, hidden 384, intermediate 1536
    assert bench.encoder_params(6, 384) == 10_646_784
    with pytest.raises(ValueError, match="layers and hidden must be positive"):
        bench.encoder_params(0, 768)


def test_flops_per_sequence_is_weights_plus_attention() -> None:
    params = bench.encoder_params(12, 768)
    # 2 x P x T + 4 x L x T^2 x H
    assert bench.flops_per_sequence(params, 12, 768, 128) == 2 * params * 128 + 4 * 12 * 128**2 * 768
    at_512 = bench.flops_per_sequence(params, 12, 768, 512)
    assert at_512 == pytest.approx(96.76e9, rel=1e-3)
    # attention grows with T^2: its share at 512 tokens is four times its share's weight at 128
    attention_512 = 4 * 12 * 512**2 * 768
    assert attention_512 / at_512 == pytest.approx(0.0999, abs=1e-3)


def test_bound_from_the_peak() -> None:
    flops = bench.flops_per_sequence(bench.encoder_params(12, 768), 12, 768, 512)
    # an H100 SXM at 989 TFLOP/s: about 10,221 BERT-base sequences of 512 tokens per second at the very most
    assert bench.bound_sequences_per_s(989, flops) == pytest.approx(10_221, rel=1e-3)
    assert bench.bound_sequences_per_s(65, flops) == pytest.approx(10_221 * 65 / 989, rel=1e-3)


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA A10G", 70.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
        ("Tesla T4", 65.0),
        ("Quadro RTX 8000", None),
    ],
)
def test_peak_by_gpu_name(name: str, tflops: float | None) -> None:
    assert bench.peak_tflops_for(name) == tflops


# --- bench_gpu: what to measure -----------------------------------------------------------------------------


def test_model_spec() -> None:
    spec = bench.parse_model_spec("name=bert_base,layers=12,hidden=768,onnx=a/1/model.onnx,plan=b/1/model.plan")
    assert spec == bench.ModelSpec("bert_base", 12, 768, Path("a/1/model.onnx"), Path("b/1/model.plan"), "bert_base")
    assert spec.params == 85_054_464
    other = bench.parse_model_spec("name=m,layers=6,hidden=384,intermediate=1000,onnx=x,plan=y,served=m_trt")
    assert (other.served, other.intermediate) == ("m_trt", 1000)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name=m,layers=6,hidden=384,onnx=x", "missing plan"),
        ("name=m,layers=six,hidden=384,onnx=x,plan=y", "layers must be an integer, got 'six'"),
        ("name=m,layers=0,hidden=384,onnx=x,plan=y", "layers must be positive"),
        ("name=m,layers=6,hidden=384,onnx=x,plan=y,heads=12", "unknown key 'heads'"),
        ("name=m,name=n,layers=6,hidden=384,onnx=x,plan=y", "name given twice"),
        ("name=m,layers,hidden=384,onnx=x,plan=y", "'layers' is not KEY=VALUE"),
    ],
)
def test_bad_model_specs(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        bench.parse_model_spec(text)


def test_bad_model_spec_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench.main(["--model", "name=m", "--gpu-name", "NVIDIA L4"])
    assert exited.value.code == 2
    assert "missing layers, hidden, onnx, plan" in capsys.readouterr().err


def test_concurrency_fills_the_batcher() -> None:
    assert bench.concurrency_for(1, 64) == 64  # capped
    assert bench.concurrency_for(8, 64) == 16  # two batches of 64
    assert bench.concurrency_for(32, 64) == 4
    assert bench.concurrency_for(64, 64) == 4  # never fewer than 4 in flight


def test_seconds_per_cell_share_the_budget() -> None:
    assert bench.seconds_per_cell(240, 48) == 2.0  # 3.5 s shared out, the ceiling
    assert bench.seconds_per_cell(100, 48) == pytest.approx(0.7 * 100 / 48)
    assert bench.seconds_per_cell(10, 48) == 0.3  # the floor
    assert bench.seconds_per_cell(10, 0) == 2.0


def test_measure_counts_sequences_and_respects_the_deadline() -> None:
    import time

    calls: list[float] = []

    def call() -> None:
        time.sleep(0.01)
        calls.append(time.monotonic())

    rate = bench.measure(call, batch=8, seconds=0.2, deadline=time.monotonic() + 5)
    assert isinstance(rate, float)
    assert 8 / 0.02 < rate <= 8 / 0.01 * 1.05  # about 8 sequences per 10 ms
    assert len(calls) >= 10
    calls.clear()
    assert bench.measure(call, batch=8, seconds=1.0, deadline=time.monotonic() + 0.5) == "-"
    assert calls == []  # a cell the budget no longer covers runs nothing


def test_measure_window_keeps_requests_in_flight() -> None:
    import time

    in_flight = 0
    most = 0

    class Handle:
        def __init__(self) -> None:
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)

        def get_result(self) -> None:
            nonlocal in_flight
            time.sleep(0.002)
            in_flight -= 1

    rate = bench.measure_window(Handle, batch=4, concurrency=6, seconds=0.2, deadline=time.monotonic() + 5)
    assert isinstance(rate, float)
    assert rate > 0
    assert most == 6
    assert in_flight == 0  # drained
    assert bench.measure_window(Handle, 4, 6, seconds=1.0, deadline=time.monotonic()) == "-"


def test_feeds_look_like_tokenizer_output() -> None:
    feeds = bench.make_feeds({"input_ids": np.int64, "attention_mask": np.int64, "token_type_ids": np.int32}, 8, 128)
    assert {k: (v.shape, v.dtype) for k, v in feeds.items()} == {
        "input_ids": ((8, 128), np.dtype(np.int64)),
        "attention_mask": ((8, 128), np.dtype(np.int64)),
        "token_type_ids": ((8, 128), np.dtype(np.int32)),
    }
    assert feeds["attention_mask"].min() == 1
    assert feeds["token_type_ids"].max() == 0
    assert 1000 <= feeds["input_ids"].min() <= feeds["input_ids"].max() < 30000


# --- bench_gpu: the table -----------------------------------------------------------------------------------


def test_table_shows_each_runner_beside_the_bound() -> None:
    bound = 10_221.2
    rows = [
        bench.Row("bert_base", 1, 128, 44_195.0, {"tensorrt": 812.3, "ort_cuda": 401.0, "served": 655.5}),
        bench.Row("bert_base", 64, 512, bound, {"tensorrt": 5_110.6, "ort_cuda": "error: RuntimeError", "served": "-"}),
        bench.Row("minilm", 8, 128, None, {"tensorrt": 42.25}),
    ]
    text = bench.format_table(rows, gpu="NVIDIA H100 80GB HBM3", peak_tflops=989.0, ort_precision="fp16")
    lines = text.splitlines()
    assert lines[0] == "GPU: NVIDIA H100 80GB HBM3 | 989 TFLOP/s dense fp16 tensor peak | sequences/s"
    assert "2 x P x T + 4 x L x T^2 x H" in lines[1]
    header = lines[2].split("  ")
    assert [h.strip() for h in header if h.strip()] == [
        "model",
        "batch",
        "tokens",
        "TensorRT (in-process)",
        "ORT CUDA fp16",
        "served plan (HTTP)",
        "FLOP bound",
        "best/bound",
    ]
    assert set(lines[3].replace(" ", "")) == {"-"}
    assert len({len(line) for line in lines[2:]}) == 1  # aligned columns
    first = lines[4].split()
    assert first == ["bert_base", "1", "128", "812", "401", "656", "44,195", "1.8", "%"]
    second = lines[5]
    assert "5,111" in second
    assert "error: RuntimeError" in second
    assert second.split()[-2:] == ["50.0", "%"]  # the best measured runner over the bound
    third = lines[6].split()
    assert third[3] == "42.2"  # under 100: one decimal
    assert third[4:6] == ["-", "-"]  # not measured
    assert third[-2:] == ["?", "?"]  # no bound without a peak
    unknown = bench.format_table(rows[:1], gpu="Quadro RTX 8000", peak_tflops=None, ort_precision="fp32")
    assert "peak unknown (give --peak-tflops)" in unknown
    assert "ORT CUDA fp32" in unknown


# --- bench_gpu's runners, as far as they run without a GPU ------------------------------------------------------


@pytest.mark.integration
def test_served_runner_keeps_the_batcher_full(tmp_path: Path) -> None:
    """The served row's loop against a real modelsvc (a small ONNX model on the CPU): answers counted, the dynamic
    batcher fed batches larger than one request, the client closed."""
    from modelsvc.tools import onnx_models as om
    from tests._server import ModelsvcProcess

    config = """name: "tok"
backend: "onnxruntime"
max_batch_size: 16
input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
        { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""
    om.write_model(tmp_path, "tok", om.token_classifier(vocab=30000, layers=2), config)
    with ModelsvcProcess(tmp_path) as server:
        served = bench.Served(server.url, "tok", {"input_ids": np.int64, "attention_mask": np.int64}, ["logits"])
        concurrency = bench.concurrency_for(2, 16)
        assert concurrency == 16
        submit, close = served.submitter(2, 32, concurrency)
        try:
            import time

            rate = bench.measure_window(submit, 2, concurrency, seconds=0.5, deadline=time.monotonic() + 30)
        finally:
            close()
        assert isinstance(rate, float)
        assert rate > 0
        stats = server.model_stats("tok")
        assert stats["inference_count"] > stats["execution_count"]  # several requests per batch


def test_ort_cuda_session_refuses_a_cpu_fallback(tmp_path: Path) -> None:
    """ONNX Runtime falls back to the CPU silently when CUDA cannot load: the bench says so instead of measuring."""
    from modelsvc.tools import onnx_models as om

    om.write_model(tmp_path, "tok", om.token_classifier(), None)
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        smi = shutil.which("nvidia-smi")
        if smi is not None and subprocess.run([smi], capture_output=True, timeout=30).returncode == 0:
            pytest.skip("this machine has a GPU: ONNX Runtime may really run on CUDA")
    with pytest.raises(RuntimeError, match=r"\(no CUDAExecutionProvider\): its CUDA libraries did not load"):
        bench.ort_cuda_session(tmp_path / "tok" / "1" / "model.onnx")
