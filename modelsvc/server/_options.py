"""What ``modelsvc serve`` takes (``ServeOptions``): tritonserver's flags, parsed, and modelsvc's own."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..engine import CacheSettings, ModelControlMode
from ._restricted import RestrictedApis
from .grpc import DEFAULT_MAX_MESSAGE_BYTES, H2Limits
from .observe import DEFAULT_INTERVAL_MS, TraceSettings

DEFAULT_ARENA_BYTES = 32 * 1024 * 1024
"""Shared memory per ingest worker and direction (inputs in the worker's, outputs in the engine's); past it, tensors
go inline."""


@dataclass(slots=True)
class ServeOptions:
    """What ``modelsvc serve`` takes; names follow tritonserver's flags."""

    model_repository: Path | str
    """A folder, or a remote repository's URL (``s3://``, ``gs://``, ``az://``...), copied into a local cache."""
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    allow_gpu_metrics: bool = True
    """nv_gpu_* series through NVML (none, and one INFO line, where NVML or a GPU is missing)."""
    allow_cpu_metrics: bool = True
    """nv_cpu_* series from /proc."""
    metrics_interval_ms: int = DEFAULT_INTERVAL_MS
    """How often the GPU and CPU metrics are sampled."""
    strict_model_config: bool = False
    disable_auto_complete_config: bool = False
    exit_on_error: bool = True
    http_max_input_size: int = 64 * 1024 * 1024
    grpc_max_message_size: int = DEFAULT_MAX_MESSAGE_BYTES
    """Largest gRPC message taken or sent (modelsvc's own flag: Triton has none and allows 2 GiB)."""
    grpc_engine: str = "h2"
    """What serves gRPC: ``h2`` (HTTP/2 in the event loop) or ``grpcio`` (grpcio's aio server)."""
    grpc_limits: H2Limits = field(default_factory=H2Limits)
    """The h2 engine's bounds on what a client may make the server hold (``--grpc-max-concurrent-streams``...)."""
    workers: int = 0
    """Ingest worker processes (``--workers``, resolved): 0 runs the doors in this process, as Triton's one process;
    N > 0 starts N processes that share the HTTP and gRPC ports and send each inference to this one (``ingest``)."""
    ingest_arena_bytes: int = DEFAULT_ARENA_BYTES
    """Shared memory per worker and direction for large tensors (``--ingest-arena-bytes``)."""
    exit_timeout_secs: int = 30
    log_verbose: int = 0
    trace: TraceSettings = field(default_factory=TraceSettings)
    """``--trace-config`` flags, parsed (off by default)."""
    cache: CacheSettings | None = None
    """``--cache-config`` flags, parsed; None: no response cache."""
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    repository_poll_secs: float = 15
    """Seconds between polls in POLL mode; 0: no polling."""
    load_models: tuple[str, ...] = ()
    """``--load-model`` names (EXPLICIT mode), ``("*",)`` for every model."""
    http_restricted: RestrictedApis = field(default_factory=RestrictedApis)
    """``--http-restricted-api`` groups; empty: nothing restricted."""
    grpc_restricted: RestrictedApis = field(default_factory=RestrictedApis)
    """``--grpc-restricted-protocol`` groups."""
