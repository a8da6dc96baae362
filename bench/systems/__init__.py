"""The systems under comparison: django-rdbtasks and its peers."""

from __future__ import annotations

from .base import System
from .chancy import Chancy
from .pgqueuer import PgQueuer
from .procrastinate import Procrastinate
from .rdbtasks import RDBTasks
from .tasksdb import TasksDB

ALL: dict[str, type[System]] = {
    RDBTasks.key: RDBTasks,
    TasksDB.key: TasksDB,
    Procrastinate.key: Procrastinate,
    PgQueuer.key: PgQueuer,
    Chancy.key: Chancy,
}

__all__ = ["ALL", "Chancy", "PgQueuer", "Procrastinate", "RDBTasks", "System", "TasksDB"]
