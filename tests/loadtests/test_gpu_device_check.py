"""loadtests/gpu/device_check.sh without a GPU: it parses, passes shellcheck where installed, refuses to run with
no nvidia-smi or a failing one (exit 2, the reason, nothing else run), and with a fake GPU its steps record FAIL and
SKIP with their reasons, write the summary and the logs to $OUT and exit 1. The steps themselves run on a GPU."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "loadtests" / "gpu" / "device_check.sh"
BASH = shutil.which("bash") or "/bin/bash"
FAKE_SMI = 'echo "NVIDIA H200, 580.159.04, 143771 MiB, 9.0"\n'


def _tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _run(tmp_path: Path, path: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {"PATH": path, "HOME": str(tmp_path), "TMPDIR": str(tmp_path), **env}
    return subprocess.run([BASH, str(SCRIPT)], capture_output=True, text=True, timeout=60, env=environment)


def _bare_bin(tmp_path: Path, nvidia_smi: str | None) -> str:
    """A PATH with the one tool the script runs before its GPU check (dirname), and nvidia-smi as given."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "dirname").symlink_to(shutil.which("dirname") or "/usr/bin/dirname")
    if nvidia_smi is not None:
        _tool(folder, "nvidia-smi", nvidia_smi)
    return str(folder)


def test_the_script_parses_and_passes_shellcheck() -> None:
    done = subprocess.run([BASH, "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert os.access(SCRIPT, os.X_OK)
    shellcheck = shutil.which("shellcheck")
    if shellcheck is not None:
        done = subprocess.run([shellcheck, "-x", str(SCRIPT)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout


def test_without_nvidia_smi_it_refuses_with_the_reason(tmp_path: Path) -> None:
    done = _run(tmp_path, _bare_bin(tmp_path, None))
    assert done.returncode == 2
    assert "device_check.sh: no NVIDIA GPU here: nvidia-smi is not on PATH" in done.stderr
    assert done.stdout == ""
    assert not list(tmp_path.glob("device-check.*"))  # nothing started


def test_a_failing_nvidia_smi_is_no_gpu_with_its_reason(tmp_path: Path) -> None:
    smi = 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver." >&2\nexit 9\n'
    done = _run(tmp_path, _bare_bin(tmp_path, smi))
    assert done.returncode == 2
    assert "device_check.sh: no usable NVIDIA GPU: nvidia-smi failed: NVIDIA-SMI has failed" in done.stderr


def test_on_this_machine_it_refuses_where_there_is_no_gpu(tmp_path: Path) -> None:
    smi = shutil.which("nvidia-smi")
    if smi is not None and subprocess.run([smi], capture_output=True, timeout=30).returncode == 0:
        pytest.skip("this machine has a working NVIDIA GPU")
    done = _run(tmp_path, os.environ["PATH"])
    assert done.returncode == 2
    assert re.search(r"device_check\.sh: no (usable )?NVIDIA GPU", done.stderr), done.stderr


def test_help_and_bad_arguments(tmp_path: Path) -> None:
    shown = subprocess.run([BASH, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0
    assert "OUT=DIR" in shown.stdout
    bad = subprocess.run([BASH, str(SCRIPT), "--wheels", "x"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2
    assert "takes no arguments (see --help), got: --wheels x" in bad.stderr


def test_failing_steps_are_recorded_with_reasons_and_the_summary_reaches_out(tmp_path: Path) -> None:
    """A fake GPU and a Python that cannot import anything: imports FAIL, what needs them SKIP, exit 1."""
    fake = tmp_path / "fake"
    fake.mkdir()
    _tool(fake, "nvidia-smi", FAKE_SMI)
    _tool(fake, "python-broken", "echo \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n")
    (tmp_path / "no-wheels").mkdir()
    out = tmp_path / "out"
    done = _run(
        tmp_path,
        f"{fake}:{os.environ['PATH']}",
        PYTHON=str(fake / "python-broken"),
        WHEELS=str(tmp_path / "no-wheels"),
        OUT=str(out),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    summary = (out / "summary.txt").read_text()
    assert summary.startswith("device_check.sh on NVIDIA H200, 580.159.04, 143771 MiB, 9.0, ")
    results = dict(re.findall(r"^(\S+)\s+(PASS|FAIL|SKIP)\b", summary, re.MULTILINE))
    assert results == {
        "gpu": "PASS",
        "wheels": "SKIP",
        "imports": "FAIL",
        "ort-cuda": "SKIP",
        "tensorrt": "SKIP",
        "pytest-gpu": "SKIP",
        "pytest-rest": "SKIP",
        "served": "SKIP",
    }
    assert re.search(r"^imports\s+FAIL exit 1: ModuleNotFoundError: No module named 'torch'", summary, re.MULTILINE)
    assert "01-imports.log: its failures and skips" in done.stderr  # the failed step's log, its end printed
    assert "device_check.sh: 1 step(s) failed" in done.stderr
    assert not (out / "table.md").exists()
    with tarfile.open(out / "logs.tgz") as logs:
        names = sorted(Path(n).name for n in logs.getnames() if n.endswith(".log"))
    assert names == ["00-nvidia-smi.log", "01-imports.log", "02-ort-cuda.log", "03-tensorrt.log"]


# --- bench_torch's parts that need no GPU (its served checks and table run in device_check.sh) ------------------


def test_bench_torch_config_and_table() -> None:
    from loadtests.gpu import bench_torch as bt

    gpu = bt.config("gpu_fp16", "KIND_GPU", "fp16", 384)
    assert 'backend: "pytorch"' in gpu
    assert "instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]" in gpu
    assert 'output [ { name: "embeddings" data_type: TYPE_FP16 dims: [ 384 ] } ]' in gpu
    assert "kind: KIND_CPU count: 1 }" in bt.config("cpu", "KIND_CPU", "fp32", 384)
    rows: dict[str, dict[int, float | str]] = {"gpu": {1: 2704.3, 8: 95.25}, "cpu": {1: "error: RuntimeError"}}
    text = bt.table(rows, [1, 8], "GPU: NVIDIA H200")
    assert text.splitlines() == [
        "GPU: NVIDIA H200",
        "",
        "| model (instance) | batch 1 | batch 8 |",
        "|---|---|---|",
        "| gpu (KIND_GPU fp32) | 2,704 | 95.2 |",
        "| cpu (KIND_CPU fp32) | error: RuntimeError | - |",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kinds", "gpu,tpu"], "--kinds: unknown ['tpu']"),
        (["--hidden", "100"], "--hidden must be a positive multiple of 64"),
        (["--batches", "1,128"], "--batches: sizes from 1 to 64"),
    ],
)
def test_bench_torch_usage_errors(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from loadtests.gpu import bench_torch as bt

    with pytest.raises(SystemExit) as exited:
        bt.main(args)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
