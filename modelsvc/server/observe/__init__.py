"""Observing the server: Prometheus metrics with Triton's names, system and GPU metrics, OpenTelemetry tracing.

- ``_metrics``: :class:`Metrics` (the nv_* families and modelsvc's own, read from the engine's statistics);
- ``_system_metrics``: CPU and GPU gauges sampled on an interval (:class:`SystemMetrics`); ``_nvml`` reads GPUs;
- ``_tracing``: ``--trace-config``, and the spans of each sampled request (it implements the engine's ``Tracing``).
"""

from ._metrics import Metrics
from ._nvml import NvmlReader
from ._system_metrics import DEFAULT_INTERVAL_MS, SystemMetrics
from ._tracing import TraceConfigError, TraceSettings, parse_trace_config, start_tracing

__all__ = [
    "DEFAULT_INTERVAL_MS",
    "Metrics",
    "NvmlReader",
    "SystemMetrics",
    "TraceConfigError",
    "TraceSettings",
    "parse_trace_config",
    "start_tracing",
]
