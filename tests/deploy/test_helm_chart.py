"""The Helm chart (helm/ml-service): `helm lint` and `helm template` over every values set in its ci/ folder,
each rendered manifest validated offline, the service.yaml the chart deploys, bad values, NOTES.txt and the
chart's documentation.

How a manifest is validated (Kubernetes' schemas with strict fields, KEDA's vendored CRD) and where helm comes
from: tests/_helm.py. The chart's behaviour on what it renders: tests/deploy/test_helm_chart_workloads.py (Services,
probes, drain, GPU placement, modelsvc or Triton, the model repository, security) and
tests/deploy/test_helm_chart_scaling.py (autoscaling, monitoring).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests import _helm
from tests._helm import (
    CHART,
    CRD_SCHEMAS,
    KUBERNETES_VERSION,
    SERVICE_YAML,
    VALUES_SETS,
    Doc,
    Renderer,
    container,
    of_kind,
    one,
    pod_spec,
    render_set,
    run_helm,
    validate,
    values_args,
)

# the chart tests' fixtures: one helm binary (installed once into .tools/), its environment, the renderer
helm = _helm.helm
helm_env = _helm.helm_env
renderer = _helm.renderer


# --- the validators ----------------------------------------------------------------------------------


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
