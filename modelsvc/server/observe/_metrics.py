"""Prometheus metrics with Triton's names.

Triton's counters carry bare names (``nv_inference_request_success``, not ``..._total``), and the
dashboards and autoscaling queries teams already run use them. prometheus-client's exposition adds
``_total`` to every counter, so the nv_* families are written here from prometheus-client's
metric families, while the process collectors go through prometheus-client unchanged.

Beside Triton's, under ``modelsvc_`` names: the execution provider each model version really runs on, and for
model versions with padding-aware batching (``pad_inputs`` in their config's parameters) what padding costs:
``modelsvc_batch_tokens_computed`` (rows x padded length, summed over batches), ``modelsvc_batch_tokens_useful``
(the requests' own rows x length) and the histogram ``modelsvc_batch_fill`` (useful / computed of each batch);
for model versions with ``sequence_batching`` the gauges ``modelsvc_sequence_active`` (sequences holding a slot)
and ``modelsvc_sequence_backlog`` (sequences waiting for one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from ...engine import ModelManager, ModelVersion, ResponseCache
from ...scheduler import SequenceScheduler
from ._system_metrics import SystemMetrics

_LABELS = ("model", "version")

#: (name, help, reads the value from a loaded model version) — all counters
_COUNTERS: tuple[tuple[str, str, Callable[[ModelVersion], float]], ...] = (
    (
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        lambda mv: mv.stats.success.count,
    ),
    (
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes",
        lambda mv: mv.stats.fail.count,
    ),
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        lambda mv: mv.stats.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        lambda mv: mv.stats.execution_count,
    ),
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds",
        lambda mv: (mv.stats.success.ns + mv.stats.fail.ns) // 1000,
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds",
        lambda mv: mv.stats.queue.ns // 1000,
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds",
        lambda mv: mv.stats.compute_input.ns // 1000,
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds",
        lambda mv: mv.stats.compute_infer.ns // 1000,
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds",
        lambda mv: mv.stats.compute_output.ns // 1000,
    ),
)


def _counter_families(
    counters: Sequence[tuple[str, str, Callable[[ModelVersion], float]]], versions: list[ModelVersion]
) -> list[Metric]:
    """One counter family per (name, help, read), with a sample per model version."""
    families = []
    for name, doc, read in counters:
        family = Metric(name, doc, "counter")
        for mv in versions:
            family.add_sample(name, {"model": mv.name, "version": str(mv.version)}, float(read(mv)))
        families.append(family)
    return families


def model_families(models: ModelManager) -> list[Metric]:
    """The nv_* families (and modelsvc's own additions) for every loaded model version."""
    loaded = list(models.loaded())
    families = _counter_families(_COUNTERS, loaded)
    pending = Metric(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        "gauge",
    )
    providers = Metric(
        "modelsvc_model_execution_provider",
        "Execution provider that really runs each model version (1 = in use)",
        "gauge",
    )
    for mv in loaded:
        labels = {"model": mv.name, "version": str(mv.version)}
        pending.add_sample(pending.name, labels, float(mv.scheduler.pending_count))
        for provider in mv.providers:
            providers.add_sample(providers.name, {**labels, "provider": provider}, 1.0)
    cache = models.cache
    return [
        *families,
        pending,
        providers,
        *padding_families(loaded),
        *sequence_families(loaded),
        *([] if cache is None else cache_families(cache, loaded)),
    ]


#: padding-aware batching's counters per model version (modelsvc's own: Triton has no such batcher)
_PADDING_COUNTERS: tuple[tuple[str, str, Callable[[ModelVersion], float]], ...] = (
    (
        "modelsvc_batch_tokens_computed",
        "Tokens computed by padded batches: rows x padded length, summed over batches",
        lambda mv: mv.stats.tokens_computed,
    ),
    (
        "modelsvc_batch_tokens_useful",
        "Tokens of the requests themselves in padded batches: each request's rows x its own length, summed",
        lambda mv: mv.stats.tokens_useful,
    ),
)


def padding_families(loaded: list[ModelVersion]) -> list[Metric]:
    """The padding families for the model versions that pad their inputs (``pad_inputs``); none without any."""
    padded = [mv for mv in loaded if "pad_inputs" in mv.config.parameters]
    if not padded:
        return []
    families = _counter_families(_PADDING_COUNTERS, padded)
    fill = Metric(
        "modelsvc_batch_fill",
        "Fill of each padded batch: useful tokens / computed tokens (1 = no padding)",
        "histogram",
    )
    for mv in padded:
        labels = {"model": mv.name, "version": str(mv.version)}
        histogram = mv.stats.batch_fill
        below = 0
        for bound, count in zip(histogram.bounds, histogram.counts, strict=True):
            below += count
            le = floatToGoString(bound)  # type: ignore[no-untyped-call]
            fill.add_sample(f"{fill.name}_bucket", {**labels, "le": le}, float(below))
        fill.add_sample(f"{fill.name}_bucket", {**labels, "le": "+Inf"}, float(histogram.count))
        fill.add_sample(f"{fill.name}_count", labels, float(histogram.count))
        fill.add_sample(f"{fill.name}_sum", labels, histogram.sum)
    return [*families, fill]


def sequence_families(loaded: list[ModelVersion]) -> list[Metric]:
    """The sequence batcher's gauges for model versions with ``sequence_batching``; none without any:
    ``modelsvc_sequence_active`` (sequences holding a slot) and ``modelsvc_sequence_backlog`` (sequences waiting
    for one)."""
    chosen = [(mv, mv.scheduler) for mv in loaded if isinstance(mv.scheduler, SequenceScheduler)]
    if not chosen:
        return []
    active = Metric("modelsvc_sequence_active", "Sequences holding a sequence slot, per model version", "gauge")
    backlog = Metric(
        "modelsvc_sequence_backlog", "Sequences waiting for a slot (the backlog), per model version", "gauge"
    )
    for mv, scheduler in chosen:
        labels = {"model": mv.name, "version": str(mv.version)}
        active.add_sample(active.name, labels, float(scheduler.live_sequences))
        backlog.add_sample(backlog.name, labels, float(scheduler.backlog_sequences))
    return [active, backlog]


#: the response cache's counters per model version, Triton's names (durations in microseconds)
_CACHE_COUNTERS: tuple[tuple[str, str, Callable[[ModelVersion], float]], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", lambda mv: mv.stats.cache_hit.count),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", lambda mv: mv.stats.cache_miss.count),
    (
        "nv_cache_hit_duration_per_model",
        "Total cache hit duration per model, in microseconds",
        lambda mv: mv.stats.cache_hit.ns // 1000,
    ),
    (
        "nv_cache_miss_duration_per_model",
        "Total cache miss (insert + lookup) duration per model, in microseconds",
        lambda mv: mv.stats.cache_miss.ns // 1000,
    ),
)


def cache_families(cache: ResponseCache, loaded: list[ModelVersion]) -> list[Metric]:
    """The response cache's families when the server has one: server-wide gauges as Triton's local cache
    reports them, and counters for each model version that uses the cache (as Triton, no others)."""
    loaded = [mv for mv in loaded if mv.config.response_cache.enable]
    gauges = (
        ("nv_cache_num_entries", "Number of responses stored in response cache", cache.entries),
        ("nv_cache_num_lookups", "Number of cache lookups in response cache", cache.lookups),
        ("nv_cache_num_hits", "Number of cache hits in response cache", cache.hits),
        ("nv_cache_num_misses", "Number of cache misses in response cache", cache.misses),
        ("nv_cache_num_evictions", "Number of cache evictions in response cache", cache.evictions),
        (
            "nv_cache_lookup_duration",
            "Total cache lookup duration (hit and miss), in microseconds",
            cache.lookup_ns // 1000,
        ),
        ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds", cache.insert_ns // 1000),
        ("nv_cache_util", "Cache utilization [0.0 - 1.0]", cache.utilization),
    )
    families = []
    for name, doc, value in gauges:
        family = Metric(name, doc, "gauge")
        family.add_sample(name, {}, float(value))
        families.append(family)
    return families + _counter_families(_CACHE_COUNTERS, loaded)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render_families(families: Iterable[Metric]) -> bytes:
    """Prometheus text format, with each family's name exactly as given."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {family.documentation}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for sample in family.samples:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels.items())
            label_text = f"{{{labels}}}" if labels else ""
            value = floatToGoString(sample.value)  # type: ignore[no-untyped-call]
            lines.append(f"{sample.name}{label_text} {value}")
    return ("\n".join(lines) + "\n").encode()


class Metrics:
    """What ``GET /metrics`` on the metrics port answers: the models' families, the GPU and CPU ones that
    ``system`` sampled last (None: none), then the process collectors."""

    def __init__(
        self,
        models: ModelManager,
        system: SystemMetrics | None = None,
        more: Sequence[Callable[[], list[Metric]]] = (),
    ) -> None:
        self.models = models
        self.system = system
        self.more = more
        """Further sources of families (the ingest workers' counters)."""
        self.process_registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.process_registry)
        PlatformCollector(registry=self.process_registry)

    def render(self) -> bytes:
        families = model_families(self.models)
        if self.system is not None:
            families.extend(self.system.families())
        for source in self.more:
            families.extend(source())
        return render_families(families) + generate_latest(self.process_registry)
