"""Request queues and batch formation in front of model instances."""

from ._planner import BatchPolicy, Plan, plan_batch
from ._scheduler import QueuePolicy, Scheduler, SchedulerConfig, TimeoutAction, WorkItem
from ._stats import BatchStat, Duration, ModelStats

__all__ = [
    "BatchPolicy",
    "BatchStat",
    "Duration",
    "ModelStats",
    "Plan",
    "QueuePolicy",
    "Scheduler",
    "SchedulerConfig",
    "TimeoutAction",
    "WorkItem",
    "plan_batch",
]
