"""The systems under comparison: django-rdbtasks and its two peers."""

from __future__ import annotations

from .base import System
from .procrastinate import Procrastinate
from .rdbtasks import RDBTasks
from .tasksdb import TasksDB

ALL: dict[str, type[System]] = {
    RDBTasks.key: RDBTasks,
    TasksDB.key: TasksDB,
    Procrastinate.key: Procrastinate,
}

__all__ = ["ALL", "Procrastinate", "RDBTasks", "System", "TasksDB"]
