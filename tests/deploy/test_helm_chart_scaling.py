"""The Helm chart's autoscaling and monitoring, checked on what `helm template` renders: KEDA's ScaledObjects or
HPAs (or fixed replicas), the triggers and the metrics their queries name (the ones the two servers export),
ServiceMonitors and the annotations for annotation-based scraping.

helm, the renderer and the validation: tests/_helm.py; lint and validation of every values set:
tests/deploy/test_helm_chart.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import _helm
from tests._helm import Doc, Renderer, container, of_kind, one, render_set, validate

# the chart tests' fixtures: one helm binary (installed once into .tools/), its environment, the renderer
helm = _helm.helm
helm_env = _helm.helm_env
renderer = _helm.renderer


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
