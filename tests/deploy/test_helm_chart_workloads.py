"""The Helm chart's workloads, checked on what `helm template` renders: the logic half's way to the model half
(its Services, the headless one), probes, drain and rollouts, GPU placement, modelsvc or Triton, where the model
repository comes from, and the pods' security and images.

helm, the renderer and the validation: tests/_helm.py; lint and validation of every values set:
tests/deploy/test_helm_chart.py.
"""

from __future__ import annotations

import json

import pytest

from tests import _helm
from tests._helm import VALUES_SETS, Renderer, container, flag, of_kind, one, pod_spec, render_set, validate

# the chart tests' fixtures: one helm binary (installed once into .tools/), its environment, the renderer
helm = _helm.helm
helm_env = _helm.helm_env
renderer = _helm.renderer


# --- the logic half calls the model half -----------------------------------------------------------------


@pytest.mark.parametrize(("values_set", "url"), [(None, "http://{}:8000"), ("image-values.yaml", "grpc://{}:8001")])
def test_logic_points_at_the_model_service(renderer: Renderer, values_set: str | None, url: str) -> None:
    """By default through the headless Service with DNS discovery; with logic.modelDiscovery=none through the
    normal Service (and no headless one is rendered)."""
    docs = render_set(renderer, values_set)
    headless = one(docs, "Service", "model-headless")
    env = {e["name"]: e.get("value") for e in container(docs, "logic")["env"]}
    assert env["LOGICD_MODEL_SERVICE__URL"] == url.format(headless["metadata"]["name"])
    assert env["LOGICD_MODEL_SERVICE__DISCOVERY"] == "dns"
    model_service = one(docs, "Service", "model")
    ports = {p["name"]: p["port"] for p in model_service["spec"]["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}

    docs = render_set(renderer, values_set, "--set", "logic.modelDiscovery=none")
    assert not [d for d in of_kind(docs, "Service") if d["metadata"]["name"].endswith("-headless")]
    env = {e["name"]: e.get("value") for e in container(docs, "logic")["env"]}
    assert env["LOGICD_MODEL_SERVICE__URL"] == url.format(one(docs, "Service", "model")["metadata"]["name"])
    assert env["LOGICD_MODEL_SERVICE__DISCOVERY"] == "none"


def test_the_headless_service_resolves_to_the_ready_model_pods(renderer: Renderer) -> None:
    """clusterIP None: its name answers each ready pod's address (not-ready pods are left out), for the logic
    server to balance over; it selects the model pods and names their ports."""
    docs = render_set(renderer, None)
    headless = one(docs, "Service", "model-headless")
    validate(headless)
    assert headless["metadata"]["name"] == one(docs, "Service", "model")["metadata"]["name"] + "-headless"
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is False
    template = one(docs, "Deployment", "model")["spec"]["template"]
    assert headless["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    port_names = {p["name"] for p in template["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in headless["spec"]["ports"]} <= port_names
    bad = renderer.run("--set", "logic.modelDiscovery=srv")
    assert bad.returncode != 0
    assert "modelDiscovery" in bad.stderr


@pytest.mark.parametrize("values_set", VALUES_SETS)
def test_services_select_their_pods_and_name_real_ports(renderer: Renderer, values_set: str) -> None:
    docs = render_set(renderer, values_set)
    for component in ("logic", "model"):
        service = one(docs, "Service", component)
        template = one(docs, "Deployment", component)["spec"]["template"]
        assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
        port_names = {p["name"] for p in template["spec"]["containers"][0]["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names


# --- probes, drain and rollouts --------------------------------------------------------------------------


@pytest.mark.parametrize("values_set", [None, "triton-values.yaml"])
def test_probes_use_the_health_routes(renderer: Renderer, values_set: str | None) -> None:
    docs = render_set(renderer, values_set)
    expected = {
        "logic": ("/health/live", "/health/live", "/health/ready"),
        "model": ("/v2/health/ready", "/v2/health/live", "/v2/health/ready"),
    }
    for component, paths in expected.items():
        c = container(docs, component)
        probes = (c["startupProbe"], c["livenessProbe"], c["readinessProbe"])
        assert tuple(p["httpGet"]["path"] for p in probes) == paths
        assert {p["httpGet"]["port"] for p in probes} == {"http"}
        assert {"http"} <= {p["name"] for p in c["ports"]}


@pytest.mark.parametrize("values_set", [None, *VALUES_SETS])
def test_grace_period_covers_prestop_and_drain(renderer: Renderer, values_set: str | None) -> None:
    """terminationGracePeriodSeconds > preStop sleep + the server's --exit-timeout-secs, for both halves: the
    pod leaves the endpoints while preStop sleeps, then drains within its bound, and is never killed first."""
    docs = render_set(renderer, values_set)
    for deployment in of_kind(docs, "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        command = c["lifecycle"]["preStop"]["exec"]["command"]
        assert command[0] == "sleep"
        sleep = int(command[1])
        drain = flag(c["args"], "exit-timeout-secs")
        assert drain is not None, f"{deployment['metadata']['name']}: no --exit-timeout-secs"
        assert sleep > 0
        assert spec["terminationGracePeriodSeconds"] > sleep + int(drain)
    if values_set == "cpu-values.yaml":  # the values reach the flags
        c = container(docs, "logic")
        assert flag(c["args"], "exit-timeout-secs") == "60"
        assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
        assert pod_spec(docs, "logic")["terminationGracePeriodSeconds"] == 70


@pytest.mark.parametrize("values_set", [None, *VALUES_SETS])
def test_rollouts_never_lower_capacity(renderer: Renderer, values_set: str | None) -> None:
    for deployment in of_kind(render_set(renderer, values_set), "Deployment"):
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


@pytest.mark.parametrize("values_set", [None, *VALUES_SETS])
def test_pod_disruption_budgets(renderer: Renderer, values_set: str | None) -> None:
    docs = render_set(renderer, values_set)
    for component in ("logic", "model"):
        pdb = one(docs, "PodDisruptionBudget", component)
        labels = one(docs, "Deployment", component)["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert ("minAvailable" in pdb["spec"]) != ("maxUnavailable" in pdb["spec"])
    if values_set == "pvc-values.yaml":
        assert one(docs, "PodDisruptionBudget", "logic")["spec"]["minAvailable"] == 2


# --- GPU placement ----------------------------------------------------------------------------------------


def test_gpu_values_place_model_pods_on_gpu_nodes(renderer: Renderer) -> None:
    docs = render_set(renderer, "gpu-values.yaml")
    gpu_labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    model = pod_spec(docs, "model")
    assert gpu_labels.items() <= model["nodeSelector"].items()
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in model["tolerations"]
    resources = container(docs, "model")["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    assert resources["limits"]["memory"] == "16Gi"  # the values' own limits are kept
    assert container(docs, "model")["image"] == "modelsvc-gpu:0.1.0"


def test_gpu_values_prefer_gpu_nodes_for_logic_pods(renderer: Renderer) -> None:
    """Preferred, never required: logic pods may land on GPU nodes (they tolerate the taint) and prefer them."""
    docs = render_set(renderer, "gpu-values.yaml")
    logic = pod_spec(docs, "logic")
    assert "nodeSelector" not in logic
    node_affinity = logic["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in node_affinity
    (preferred,) = node_affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["weight"] == 80
    expressions = {e["key"]: (e["operator"], e["values"]) for e in preferred["preference"]["matchExpressions"]}
    assert expressions == {
        "nvidia.com/gpu.present": ("In", ["true"]),
        "nvidia.com/gpu.product": ("In", ["NVIDIA-H100-80GB-HBM3"]),
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in logic["tolerations"]
    assert "nvidia.com/gpu" not in container(docs, "logic")["resources"].get("limits", {})


def test_cpu_values_use_no_gpu(renderer: Renderer) -> None:
    docs = render_set(renderer, "cpu-values.yaml")
    for component in ("logic", "model"):
        spec = pod_spec(docs, component)
        assert "nodeSelector" not in spec
        assert "tolerations" not in spec
        assert "nodeAffinity" not in spec.get("affinity", {})
        assert "nvidia.com/gpu" not in container(docs, component)["resources"].get("limits", {})
    assert container(docs, "model")["image"] == "modelsvc:0.1.0"


# --- modelsvc or Triton ----------------------------------------------------------------------------------


def test_triton_switch_changes_image_and_command_and_adds_shared_memory(renderer: Renderer) -> None:
    modelsvc = render_set(renderer, None)
    triton = render_set(renderer, "triton-values.yaml")
    same_repo = renderer.render("--set", "model.server=triton")
    t = container(same_repo, "model")
    m = container(modelsvc, "model")
    assert t["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3"
    assert t["command"] == ["tritonserver"]
    assert m["command"] == ["modelsvc", "serve"]
    # one flag syntax: the same repository, ports and drain; modelsvc adds its own --workers (ingest processes)
    assert t["args"] == [a for a in m["args"] if not a.startswith("--workers=")]
    assert flag(m["args"], "workers") is not None
    assert [p["containerPort"] for p in t["ports"]] == [8000, 8001, 8002]
    for docs in (triton, same_repo):
        spec = pod_spec(docs, "model")
        dshm = next(v for v in spec["volumes"] if v["name"] == "dshm")
        assert dshm["emptyDir"]["medium"] == "Memory"
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container(docs, "model")["volumeMounts"]
        assert spec["securityContext"]["runAsUser"] == 1000  # Triton's image would run as root
    triton_dshm = next(v for v in pod_spec(triton, "model")["volumes"] if v["name"] == "dshm")
    assert triton_dshm["emptyDir"]["sizeLimit"] == "2Gi"
    assert all(v["name"] != "dshm" for v in pod_spec(modelsvc, "model")["volumes"])
    assert "runAsUser" not in pod_spec(modelsvc, "model")["securityContext"]  # the image's numeric USER
    args = container(triton, "model")["args"]
    assert flag(args, "model-control-mode") == "explicit"
    assert flag(args, "load-model") == "minilm"


def test_shared_memory_can_be_forced_for_modelsvc(renderer: Renderer) -> None:
    docs = renderer.render("--set", "model.sharedMemory.enabled=true")
    assert any(v["name"] == "dshm" for v in pod_spec(docs, "model")["volumes"])
    docs = renderer.render("--set", "model.server=triton", "--set", "model.sharedMemory.enabled=false")
    assert all(v["name"] != "dshm" for v in pod_spec(docs, "model")["volumes"])


# --- the model repository ---------------------------------------------------------------------------------


def test_repository_from_an_image(renderer: Renderer) -> None:
    docs = render_set(renderer, "image-values.yaml")
    spec = pod_spec(docs, "model")
    (init,) = spec["initContainers"]
    assert init["image"] == "registry.example.com/ml/doc-classifier-models:2024-06-01"
    assert init["command"] == ["cp", "-R", "/models/.", "/model-repository/"]
    assert init["securityContext"]["runAsUser"] == 10001  # whatever USER the repository image has
    (triton_init,) = pod_spec(render_set(renderer, "triton-values.yaml"), "model")["initContainers"]
    assert "runAsUser" not in triton_init["securityContext"]  # the pod's uid (Triton's), which reads the copy
    assert next(v for v in spec["volumes"] if v["name"] == "model-repository")["emptyDir"]
    mount = next(m for m in container(docs, "model")["volumeMounts"] if m["name"] == "model-repository")
    assert mount["readOnly"] is True
    assert flag(container(docs, "model")["args"], "model-repository") == mount["mountPath"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert container(docs, "logic")["image"].startswith("registry.example.com/ml/")


def test_repository_from_a_pvc(renderer: Renderer) -> None:
    docs = render_set(renderer, "pvc-values.yaml")
    spec = pod_spec(docs, "model")
    assert "initContainers" not in spec
    volume = next(v for v in spec["volumes"] if v["name"] == "model-repository")
    assert volume["persistentVolumeClaim"] == {"claimName": "model-repository", "readOnly": True}
    mount = next(m for m in container(docs, "model")["volumeMounts"] if m["name"] == "model-repository")
    assert mount["subPath"] == "doc-classifier"
    assert mount["readOnly"] is True


@pytest.mark.parametrize("server", ["modelsvc", "triton"])
def test_s3_repository_takes_credentials_from_a_secret_never_args(renderer: Renderer, server: str) -> None:
    docs = render_set(renderer, "s3-values.yaml", "--set", f"model.server={server}")
    c = container(docs, "model")
    assert flag(c["args"], "model-repository") == "s3://minio.storage.svc:9000/models/doc-classifier"
    assert flag(c["args"], "model-control-mode") == "poll"
    assert flag(c["args"], "repository-poll-secs") == "60"
    assert {"secretRef": {"name": "model-repository-s3"}} in c["envFrom"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["AWS_DEFAULT_REGION"] == "eu-west-1"
    text = json.dumps(c["args"]) + json.dumps(c.get("command"))
    assert "model-repository-s3" not in text  # the Secret is named only in envFrom
    assert "AWS_" not in text
    spec = pod_spec(docs, "model")
    assert "initContainers" not in spec
    assert all(v["name"] != "model-repository" for v in spec["volumes"])
    # the local copy (modelsvc's mirror, Triton's download) goes to a bounded emptyDir
    cache = next(m for m in c["volumeMounts"] if m["name"] == "repository-cache")
    variable = "MODELSVC_CACHE_DIR" if server == "modelsvc" else "TRITON_AWS_MOUNT_DIRECTORY"
    assert env[variable] == cache["mountPath"]
    assert next(v for v in spec["volumes"] if v["name"] == "repository-cache")["emptyDir"]["sizeLimit"] == "20Gi"
    # the logic half gets nothing of it
    assert "envFrom" not in container(docs, "logic")


# --- security and images ----------------------------------------------------------------------------------


@pytest.mark.parametrize("values_set", [None, *VALUES_SETS])
def test_pods_run_as_non_root_with_pinned_images(renderer: Renderer, values_set: str | None) -> None:
    for deployment in of_kind(render_set(renderer, values_set), "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            image = c["image"]
            repository, _, tag = image.rpartition(":")
            assert repository, image
            assert tag, image
            assert "/" not in tag, image
            assert tag != "latest", image


@pytest.mark.parametrize(
    ("cpu", "workers"),
    [("500m", "0"), ("2", "0"), ("2500m", "1"), ("3", "2"), ("4", "3"), ("15500m", "14"), ("16", "15"), (None, "auto")],
)
def test_modelsvc_takes_its_ingest_workers_from_the_cpu_request(
    renderer: Renderer, cpu: str | None, workers: str
) -> None:
    """--workers auto in the chart: none at 2 CPUs or fewer, else one per whole CPU requested but the engine's."""
    cpu_set = (
        ("--set", "model.resources.requests.cpu=null", "--set", "autoscaling.enabled=false")
        if cpu is None
        else ("--set-string", f"model.resources.requests.cpu={cpu}")
    )
    args = container(render_set(renderer, None, *cpu_set), "model")["args"]
    assert flag(args, "workers") == workers
    assert (
        flag(container(render_set(renderer, None, *cpu_set, "--set", "model.workers=6"), "model")["args"], "workers")
        == "6"
    )


def test_triton_gets_no_workers_flag(renderer: Renderer) -> None:
    args = container(
        render_set(renderer, None, "--set", "model.server=triton", "--set-string", "model.resources.requests.cpu=8"),
        "model",
    )["args"]
    assert flag(args, "workers") is None
