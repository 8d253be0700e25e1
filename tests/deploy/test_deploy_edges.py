"""Regression tests from the review of the images and the chart: what validated but would not have worked on a
cluster (Triton's S3 download folder and endpoint, the logic drain against service.yaml's model timeout, the GPU
image's library path). Each test states the fact it rests on; each failed before its fix."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests import _helm
from tests._helm import CHART, SERVICE_YAML, Renderer, container, flag, pod_spec, render_set

# the chart tests' fixtures: a helm binary (installed into .tools/ on first use) and the renderer
helm = _helm.helm
helm_env = _helm.helm_env
renderer = _helm.renderer

ROOT = Path(__file__).resolve().parents[2]

TRITON_S3_ENDPOINT_URL = re.compile(
    r"s3://(http://|https://|)([0-9a-zA-Z\-.]+):([0-9]+)/([0-9a-z.\-]+)(((/[0-9a-zA-Z.\-_]+)*)?)"
)
"""Triton's S3FileSystem regex (triton-inference-server/core src/filesystem/implementations/s3.h): the only way
Triton takes a non-AWS endpoint is host:port inside the URL. Its S3 client (aws-sdk-cpp 1.8.186, pinned in
triton-inference-server/third_party) predates AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 and never reads them; the
only environment Triton's S3Credential reads is AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION,
AWS_SESSION_TOKEN and AWS_PROFILE."""


def _size_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    match = re.fullmatch(r"(\d+)([A-Za-z]*)", str(quantity))
    assert match, quantity
    return int(match.group(1)) * units.get(match.group(2), 1)


def test_triton_s3_download_dir_is_bounded_by_cache_size_limit(renderer: Renderer) -> None:
    """Triton localizes an s3:// repository by downloading every model into mkdtemp() under
    $TRITON_AWS_MOUNT_DIRECTORY (default /tmp) (s3.h LocalizePath). The chart mounts /tmp as a 1Gi emptyDir and
    never gives Triton modelRepository.cacheSizeLimit, so a repository over 1 GiB gets the pod evicted."""
    docs = render_set(renderer, "s3-values.yaml", "--set", "model.server=triton")
    c = container(docs, "model")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    download_dir = env.get("TRITON_AWS_MOUNT_DIRECTORY", "/tmp")
    mount = next(
        m for m in c["volumeMounts"] if download_dir == m["mountPath"] or download_dir.startswith(m["mountPath"] + "/")
    )
    volume = next(v for v in pod_spec(docs, "model")["volumes"] if v["name"] == mount["name"])
    cache_limit = yaml.safe_load((CHART / "ci" / "s3-values.yaml").read_text())["modelRepository"]["cacheSizeLimit"]
    assert _size_bytes(volume["emptyDir"]["sizeLimit"]) >= _size_bytes(cache_limit), (
        f"Triton downloads the repository into {download_dir}, an emptyDir of {volume['emptyDir']['sizeLimit']}; "
        f"modelRepository.cacheSizeLimit is {cache_limit}"
    )


def test_triton_gets_a_custom_s3_endpoint_in_the_url(renderer: Renderer) -> None:
    """s3-values.yaml names MinIO through AWS_ENDPOINT_URL_S3, which modelsvc (botocore) honours and Triton
    ignores: with model.server=triton the same values send Triton to AWS S3's bucket "models". The chart must
    put the endpoint into --model-repository for Triton (s3://http://minio.storage.svc:9000/models/...) or refuse."""
    done = renderer.run("-f", str(CHART / "ci" / "s3-values.yaml"), "--set", "model.server=triton")
    if done.returncode != 0:
        assert "AWS_ENDPOINT_URL" in done.stderr  # refused, with a message that says why
        return
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    c = container(docs, "model")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    repository = flag(c["args"], "model-repository")
    assert repository is not None
    if "AWS_ENDPOINT_URL_S3" in env or "AWS_ENDPOINT_URL" in env:
        assert TRITON_S3_ENDPOINT_URL.fullmatch(repository), (
            f"Triton reads no AWS_ENDPOINT_URL*: --model-repository={repository} goes to AWS S3, "
            f"not {env.get('AWS_ENDPOINT_URL_S3') or env.get('AWS_ENDPOINT_URL')}"
        )


def test_logic_drain_covers_the_service_yaml_model_timeout(renderer: Renderer) -> None:
    """values.yaml (logic.drain.exitTimeoutSeconds): "Keep it at least model_service.timeout_s of service.yaml".
    The README's deploy (--set-file logic.serviceYaml=services/doc_classifier/service.yaml, timeout_s: 60) keeps
    the default 30 s: a request still waiting on the model at SIGTERM is cut after 30 s. The chart parses the
    service.yaml already (ml-service.validate) and could raise the bound or refuse."""
    service = yaml.safe_load(SERVICE_YAML.read_text())
    timeout_s = float(service["model_service"]["timeout_s"])
    done = renderer.run("--set-file", f"logic.serviceYaml={SERVICE_YAML}")
    if done.returncode != 0:
        assert "timeout_s" in done.stderr
        return
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    c = container(docs, "logic")
    exit_timeout = flag(c["args"], "exit-timeout-secs")
    assert exit_timeout is not None
    assert float(exit_timeout) >= timeout_s, (
        f"logicd --exit-timeout-secs={exit_timeout} < model_service.timeout_s={timeout_s} of the deployed service.yaml"
    )
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod_spec(docs, "logic")["terminationGracePeriodSeconds"] > sleep + timeout_s


def _final_stage_env(path: Path) -> dict[str, str]:
    text = re.sub(r"\\\n", " ", path.read_text())
    final = re.split(r"^FROM\s", text, flags=re.M)[-1]
    env: dict[str, str] = {}
    for line in final.splitlines():
        if line.startswith("ENV "):
            for key, value in re.findall(r"(\w+)=(\S+)", line[4:]):
                env[key] = value
    return env


def test_gpu_image_keeps_the_cuda_base_driver_library_path() -> None:
    """nvidia/cuda images set LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64: where the driver's
    libcuda.so is mounted on clusters that do not run the NVIDIA container runtime's ldconfig hook (GKE's driver
    installer, for one). The GPU image replaces the variable instead of extending it, so there ONNX Runtime finds no
    libcuda, fails to create the CUDA/TensorRT providers and silently runs on the CPU."""
    env = _final_stage_env(ROOT / "docker" / "modelsvc-gpu.Dockerfile")
    path = env["LD_LIBRARY_PATH"]
    assert "/usr/local/nvidia/lib64" in path or "${LD_LIBRARY_PATH}" in path or "$LD_LIBRARY_PATH" in path, path
