"""The app's tables, one module per part of the system; everything is importable from here."""

from ..states import TaskStatus
from .jobs import Job, JobQuerySet, JobRecord, MisfirePolicy
from .limits import LimitSlot
from .queues import PausedQueue
from .tasks import (
    Dashboard,
    PartialIndex,
    SearchIndex,
    StatusIndex,
    Task,
    TaskDependency,
    TaskQuerySet,
    WherePartialMissingIndex,
    task_path_in,
    uuid7,
)
from .workers import Lock, Worker, WorkerQuerySet
from .workflows import Workflow, WorkflowStep

__all__ = [
    "Dashboard",
    "Job",
    "JobQuerySet",
    "JobRecord",
    "LimitSlot",
    "Lock",
    "MisfirePolicy",
    "PartialIndex",
    "PausedQueue",
    "SearchIndex",
    "StatusIndex",
    "Task",
    "TaskDependency",
    "TaskQuerySet",
    "TaskStatus",
    "WherePartialMissingIndex",
    "Worker",
    "WorkerQuerySet",
    "Workflow",
    "WorkflowStep",
    "task_path_in",
    "uuid7",
]
