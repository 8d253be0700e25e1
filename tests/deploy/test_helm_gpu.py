"""The chart's GPU deployment, rendered and validated end to end, and what the GPU image installs.

tests/deploy/test_helm_chart.py lints and validates every values set; here the GPU rendering is checked as one whole
(``helm template`` with KEDA on, each manifest validated offline: Kubernetes' schemas with strict fields, the
ScaledObject against KEDA's vendored CRD): model pods request GPUs and run on GPU nodes only, logic pods
tolerate GPU nodes and prefer them (packed onto their spare CPUs, never required), and the model half's
ScaledObject scales on ``nv_gpu_utilization`` beside the queue triggers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests import _helm
from tests._helm import CHART, ROOT, Doc, Renderer, container, of_kind, one, pod_spec, render_set, validate

# the chart tests' fixtures: one helm binary (installed once into .tools/), its environment, the renderer
helm = _helm.helm
helm_env = _helm.helm_env
renderer = _helm.renderer

GPU_SET = "gpu-values.yaml"
GPU_KEDA = ("--set", "gpu.enabled=true,autoscaling.engine=keda")
"""The default values on GPUs, with KEDA: what `--set gpu.enabled=true` gives a cluster that runs KEDA."""
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _triggers(docs: list[Doc]) -> dict[str, Doc]:
    return {t["name"]: t for t in one(docs, "ScaledObject", "model")["spec"]["triggers"]}


def _validate_all(docs: list[Doc]) -> None:
    for doc in docs:
        try:
            validate(doc)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {exc.message}")


# --- the whole GPU rendering ------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [("-f", str(CHART / "ci" / GPU_SET)), GPU_KEDA], ids=["gpu-values", "defaults"])
def test_gpu_rendering_validates_and_places_both_halves(renderer: Renderer, args: tuple[str, ...]) -> None:
    docs = renderer.render(*args)
    _validate_all(docs)
    assert {d["kind"] for d in docs} >= {"Deployment", "Service", "ScaledObject", "PodDisruptionBudget"}

    # model pods: GPUs as a limit, on GPU nodes only (node selector), tolerating their taint
    model = pod_spec(docs, "model")
    assert model["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert GPU_TOLERATION in model["tolerations"]
    limits = container(docs, "model")["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in container(docs, "model")["resources"].get("requests", {})  # Kubernetes copies it
    assert container(docs, "model")["image"].startswith("modelsvc-gpu:")

    # logic pods: no GPU, no hard placement; they tolerate GPU nodes and prefer them and the model pods' nodes
    logic = pod_spec(docs, "logic")
    assert "nodeSelector" not in logic
    assert GPU_TOLERATION in logic["tolerations"]
    assert "nvidia.com/gpu" not in container(docs, "logic")["resources"].get("limits", {})
    affinity = logic["affinity"]
    assert set(affinity["nodeAffinity"]) == {"preferredDuringSchedulingIgnoredDuringExecution"}
    (node_pref,) = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    expressions = {e["key"]: (e["operator"], e["values"]) for e in node_pref["preference"]["matchExpressions"]}
    assert expressions == {k: ("In", [v]) for k, v in model["nodeSelector"].items()}  # the model pods' GPU nodes
    assert set(affinity["podAffinity"]) == {"preferredDuringSchedulingIgnoredDuringExecution"}
    (pod_pref,) = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    model_labels = one(docs, "Deployment", "model")["spec"]["template"]["metadata"]["labels"]
    assert pod_pref["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= model_labels.items()
    assert pod_pref["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"

    # the model half scales on the queue and on GPU utilization
    triggers = _triggers(docs)
    assert {"queue-time-per-request", "pending-requests", "gpu-utilization"} <= set(triggers)


def test_gpu_trigger_queries_nv_gpu_utilization_of_the_model_pods(renderer: Renderer) -> None:
    docs = render_set(renderer, GPU_SET)
    triggers = _triggers(docs)
    gpu = triggers["gpu-utilization"]
    assert gpu["type"] == "prometheus"
    assert gpu["metricType"] == "Value"  # an average over GPUs already: not divided by the replica count
    assert gpu["metadata"]["threshold"] == "0.7"  # the values set's 70 %, as the fraction the metric is
    assert gpu["metadata"]["ignoreNullValues"] == "true"
    # the same Prometheus and the same model-pod selector as the queue trigger
    queue = triggers["queue-time-per-request"]
    assert gpu["metadata"]["serverAddress"] == queue["metadata"]["serverAddress"]
    query = gpu["metadata"]["query"]
    assert query == 'avg(nv_gpu_utilization{namespace="ml",pod=~"demo-ml-service-model-.*"}) or vector(0)'
    assert "logic" not in query
    # never on the logic half
    assert "gpu-utilization" not in {t["name"] for t in one(docs, "ScaledObject", "logic")["spec"]["triggers"]}


def test_gpu_trigger_defaults_and_follows_the_prometheus_settings(renderer: Renderer) -> None:
    docs = renderer.render(
        *GPU_KEDA,
        "-f",
        str(CHART / "ci" / "keda-values.yaml"),
        "--set",
        "model.autoscaling.keda.gpuUtilization.targetUtilization=65",
    )
    _validate_all(docs)
    gpu = _triggers(docs)["gpu-utilization"]
    assert gpu["metadata"]["threshold"] == "0.65"
    assert gpu["authenticationRef"] == {"name": "prometheus-auth", "kind": "TriggerAuthentication"}
    assert gpu["metadata"]["serverAddress"] == "https://prometheus.monitoring.svc:9091"
    assert 'avg(nv_gpu_utilization{namespace="ml",service="demo-ml-service-model"})' in gpu["metadata"]["query"]
    default = _triggers(renderer.render(*GPU_KEDA))["gpu-utilization"]
    assert default["metadata"]["threshold"] == "0.8"


@pytest.mark.parametrize(
    "args",
    [
        ("--set", "autoscaling.engine=keda"),  # no GPU: no GPU trigger, whatever gpuUtilization says
        ("--set", "gpu.enabled=true,autoscaling.engine=keda,model.autoscaling.keda.gpuUtilization.enabled=false"),
    ],
    ids=["cpu", "switched-off"],
)
def test_gpu_trigger_only_with_gpus_and_when_switched_on(renderer: Renderer, args: tuple[str, ...]) -> None:
    docs = renderer.render(*args)
    triggers = _triggers(docs)
    assert "gpu-utilization" not in triggers
    assert {"queue-time-per-request", "pending-requests"} <= set(triggers)
    for scaled in of_kind(docs, "ScaledObject"):
        assert "nv_gpu_" not in yaml.safe_dump(scaled)


def test_the_gpu_trigger_alone_is_enough_for_keda(renderer: Renderer) -> None:
    """KEDA needs one trigger: on GPUs, GPU utilization alone is one; without GPUs it is not."""
    queue_off = "model.autoscaling.keda.queueTime.enabled=false,model.autoscaling.keda.pendingRequests.enabled=false"
    docs = renderer.render(*GPU_KEDA, "--set", queue_off)
    assert set(_triggers(docs)) == {"gpu-utilization"}
    done = renderer.run("--set", f"autoscaling.engine=keda,{queue_off}")
    assert done.returncode != 0
    assert "enable queueTime, pendingRequests, cpu or (with gpu.enabled) gpuUtilization" in done.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("101", r"gpuUtilization\.targetUtilization: Must be less than or equal to 100"),
        ("0", r"gpuUtilization\.targetUtilization: Must be greater than or equal to 1"),
        ("0.8", r"gpuUtilization\.targetUtilization: Invalid type"),  # percent, not the fraction
    ],
)
def test_bad_gpu_target_fails_naming_the_key(renderer: Renderer, value: str, message: str) -> None:
    done = renderer.run("--set", f"gpu.enabled=true,model.autoscaling.keda.gpuUtilization.targetUtilization={value}")
    assert done.returncode != 0
    assert re.search(message, done.stderr), done.stderr


def test_gpu_trigger_is_documented() -> None:
    values = (CHART / "values.yaml").read_text()
    block = values[values.index("      gpuUtilization:") :][:900]
    assert "nv_gpu_utilization" in block
    assert "targetUtilization: 80" in block
    loaded: dict[str, Any] = yaml.safe_load(values)
    assert loaded["model"]["autoscaling"]["keda"]["gpuUtilization"] == {"enabled": True, "targetUtilization": 80}
    readme = (CHART / "README.md").read_text()
    assert "`gpu-utilization`" in readme
    assert "gpuUtilization.targetUtilization" in readme


def test_gpu_metric_is_one_the_model_server_exports() -> None:
    """The trigger's series is Triton's name, and modelsvc's own metrics module exports it under that name."""
    sources = "\n".join(p.read_text() for p in (ROOT / "modelsvc" / "server").rglob("*.py"))
    assert re.search(r"[\"']nv_gpu_utilization[\"']", sources), "modelsvc/server exports no nv_gpu_utilization"


# --- the GPU image ----------------------------------------------------------------------------------------

DOCKERFILE = ROOT / "docker" / "modelsvc-gpu.Dockerfile"


def _pyproject() -> dict[str, Any]:
    import tomllib

    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_gpu_image_installs_the_cuda_python_of_its_base_and_nvml() -> None:
    """The tensorrt extra brings cuda-python (cuda.bindings), pinned in the image to the build of the base
    image's CUDA major version (13); NVML's binding is a base dependency, so every image has it."""
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:(\d+)\.(\d+)\.\d+-", text, re.M)
    assert base is not None
    pin = re.search(r"^ARG CUDA_PYTHON_VERSION=(\d+)\.(\d+)\.\d+", text, re.M)
    assert pin is not None, "the GPU image pins cuda-python (ARG CUDA_PYTHON_VERSION)"
    assert pin.group(1) == base.group(1), "cuda-python's major version is the base image's CUDA major version"
    assert int(pin.group(2)) <= int(base.group(2)), "cuda-python newer than the base image's CUDA"
    assert "cuda-python==%s" in text  # in the constraints file, next to onnxruntime-gpu's and TensorRT's pins
    assert '"${CUDA_PYTHON_VERSION}"' in text
    project = _pyproject()["project"]
    names = [re.split(r"[<>=~!;\[ ]", d, maxsplit=1)[0] for d in project["dependencies"]]
    assert "nvidia-ml-py" in names
    extra = [re.split(r"[<>=~!;\[ ]", d, maxsplit=1)[0] for d in project["optional-dependencies"]["tensorrt"]]
    assert {"tensorrt", "cuda-python"} <= set(extra)
    assert "--extra tensorrt" in text
    # and the build checks that they import (no GPU is needed for that)
    assert re.search(r"import pynvml.*cuda\.bindings", text), "the build imports pynvml and cuda.bindings"


def test_gpu_image_is_the_one_the_chart_runs_on_gpus(renderer: Renderer) -> None:
    docs = renderer.render("--set", "gpu.enabled=true,model.modelsvc.gpuImage.tag=1.2.3")
    assert container(docs, "model")["image"] == "modelsvc-gpu:1.2.3"
    readme = (CHART / "README.md").read_text()
    assert "docker/modelsvc-gpu.Dockerfile" in readme
    assert Path(DOCKERFILE).is_file()
