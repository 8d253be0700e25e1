"""Request queues and batch formation in front of model instances.

Forming batches is the extension point. A planner (``Planner``, ``_planner.py``) gets a snapshot of the queue
in dispatch order (priority level 1 first, each level's delayed requests after it, arrival order within each;
each request shows ``batch_size``, ``shape_key`` and ``enqueued_ns``) and the time, and returns a ``Plan``:
send the first ``take`` requests as one batch now, or wait ``wait_ns`` (None: until the next arrival). Its
settings come from the model config when it is built. A planner is pure: no clock, no event loop, no I/O.
A new way to form batches (padding-aware batching with a token budget; Triton's ``sequence_batching`` with
correlation IDs) is a new module with a planner class and its ``from_model_config(config) -> planner | None``,
plus one line in ``_config.PLANNERS``, where the first planner that accepts a config wins (a planner keyed on
a padding parameter goes before ``dynamic_batching``). ``BatchPolicy`` (``_dynamic.py``, the dynamic batcher)
is the first. Each planner must pass ``tests/test_planners.py`` (add it to its ``PLANNERS_UNDER_TEST``):
never over max_batch_size, priorities first, FIFO within a priority, no request lost or duplicated, no
timed-out request batched, a queue past every delay always goes; plus tests of its own rules, as
``tests/test_planner.py`` has for the dynamic batcher.
"""

from ._config import PLANNERS, QueuePolicy, SchedulerConfig, TimeoutAction, planner_for
from ._dynamic import BatchPolicy, plan_batch
from ._planner import Plan, Planner, Queued
from ._queue import WorkItem
from ._scheduler import Scheduler
from ._stats import BatchStat, Duration, ModelStats
from ._tracing import TracedBatch, TracedRequest

__all__ = [
    "PLANNERS",
    "BatchPolicy",
    "BatchStat",
    "Duration",
    "ModelStats",
    "Plan",
    "Planner",
    "QueuePolicy",
    "Queued",
    "Scheduler",
    "SchedulerConfig",
    "TimeoutAction",
    "TracedBatch",
    "TracedRequest",
    "WorkItem",
    "plan_batch",
    "planner_for",
]
