"""Request queues and batch formation in front of model instances.

One job per request (``WorkItem``, ``_job.py``) goes from the data plane to the instance: the data plane builds
it and hands it to the model version's ``Scheduler`` (a Protocol with one entry point, ``enqueue(job)``, as
Triton's ``Scheduler::Enqueue``), implemented by ``DynamicScheduler`` (``_scheduler.py``: the queue, a planner, the
instance threads), ``SequenceScheduler`` (``sequence/``) and the engine's ensemble scheduler. A new kind of
scheduler implements that Protocol and is chosen for the configs it serves in ``modelsvc.engine._version``
(``build_version``); a new way to form batches in front of the same queue is a planner (below).

Forming batches is the extension point. A planner (``Planner``, ``_planner.py``) gets a snapshot of the queue
in dispatch order (priority level 1 first, each level's delayed requests after it, arrival order within each;
each request shows ``batch_size``, ``shape_key``, ``enqueued_ns``, ``level`` and ``length``, its length along
the padded axis, 0 without padding) and the time, and returns a ``Plan``: send the first ``take`` requests as
one batch now, or the requests at the positions ``pick`` of the snapshot (``Plan.of(positions, pad_to)``),
padded to ``pad_to`` when the plan names a padded length; or wait ``wait_ns`` (None: until the next arrival).
Its settings come from the model config when it is built. A planner is pure: no clock, no event loop, no I/O.
A new way to form batches (Triton's ``sequence_batching`` with correlation IDs) is a new module with a planner
class and its ``from_model_config(config) -> planner | None``, plus one line in ``_config.PLANNERS``, where the
first planner that accepts a config wins. The planners so far:

1. ``PaddedPolicy`` (``_padded.py``, keyed ``pad_inputs``, before ``dynamic_batching``): padding-aware
   batching. Its settings (``PadSpec``, ``_padding.py``: ``pad_inputs``, ``pad_outputs``, ``pad_buckets``,
   ``max_batch_tokens`` in the config's ``parameters``) also reach the queue (``SchedulerConfig.padding``),
   which reads each request's length at arrival (a 400 for a bad one), and the instance threads
   (``_instances.Padding``), which pad each request's inputs to the batch's length and cut its padded outputs
   back to its own. The scheduler records each padded batch's tokens (``ModelStats.record_padding``:
   ``tokens_computed``, ``tokens_useful``, ``batch_fill``) and passes ``padded_length`` to the trace's
   ``batch_started``.
2. ``BatchPolicy`` (``_dynamic.py``, keyed ``dynamic_batching``): Triton's dynamic batcher, prefix plans.

Each planner must pass ``tests/scheduler/test_planners.py`` (add it to its ``PLANNERS_UNDER_TEST``): never over
max_batch_size, the oldest request of the highest priority in every batch, no request lost or duplicated, no
timed-out request batched, a queue past every delay always goes, plus the invariants of its kind there (FIFO
within a priority for prefix planners; the token budget and the buckets for the padding planner); plus tests of
its own rules, as ``tests/scheduler/test_planner.py`` has for the dynamic batcher and
``tests/scheduler/test_padded_planner.py`` for the padding-aware one.

Triton's ``sequence_batching`` is not a planner: its requests are routed by correlation id to sequence slots
that live across requests, so it is a scheduler of its own in ``sequence/``: ``SequenceScheduler``
(``sequence/_sequence.py``; settings ``SequenceSettings`` in ``_sequence_config.py``, rows in ``_sequence_rows.py``,
slots in ``_sequence_slots.py``), chosen in
``modelsvc.engine._version`` for a config with ``sequence_batching``.
"""

from ._config import PLANNERS, QueuePolicy, SchedulerConfig, TimeoutAction, planner_for
from ._dynamic import BatchPolicy, plan_batch
from ._job import Scheduler, WorkItem
from ._padded import PaddedPolicy
from ._padding import PadInput, PadSpec
from ._planner import Plan, Planner, Queued
from ._scheduler import DynamicScheduler
from ._stats import BATCH_FILL_BUCKETS, BatchStat, Duration, FillHistogram, ModelStats
from ._tracing import TracedBatch, TracedRequest
from .sequence._sequence import SequenceScheduler
from .sequence._sequence_config import SequenceConfigError, SequenceSettings, load_initial_states

__all__ = [
    "BATCH_FILL_BUCKETS",
    "PLANNERS",
    "BatchPolicy",
    "BatchStat",
    "Duration",
    "DynamicScheduler",
    "FillHistogram",
    "ModelStats",
    "PadInput",
    "PadSpec",
    "PaddedPolicy",
    "Plan",
    "Planner",
    "QueuePolicy",
    "Queued",
    "Scheduler",
    "SchedulerConfig",
    "SequenceConfigError",
    "SequenceScheduler",
    "SequenceSettings",
    "TimeoutAction",
    "TracedBatch",
    "TracedRequest",
    "WorkItem",
    "load_initial_states",
    "plan_batch",
    "planner_for",
]
