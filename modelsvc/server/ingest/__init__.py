"""Ingest workers: ``modelsvc serve --workers N``, the protocol work of every request spread over N processes.

One engine process owns the repository, the schedulers, the backends and the GPU; N worker processes share the
HTTP and gRPC ports (SO_REUSEPORT) and do each inference's protocol work. The engine sees every request, so batches
form across all connections, and all a client observes besides that work comes from one place.

- ``_pool``: how many workers (``resolve_workers``), their private folder, starting, restarting, draining (``Ingest``);
- ``_worker``: a worker process: the public doors over ``_remote.RemoteDataPlane``, the rest through ``_proxy``;
- ``_engine``: the engine's end of the channel (``EngineChannel``): each worker's calls through the data plane;
- ``_wire``: the channel's frames and messages; ``_arena``: the shared memory large tensors cross in.
"""

from ._pool import Ingest, available_cpus, resolve_workers

__all__ = ["Ingest", "available_cpus", "resolve_workers"]
