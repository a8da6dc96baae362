"""The systems under comparison: django-rdbtasks, its peers, and the SQL floor."""

from __future__ import annotations

from .base import System
from .chancy import Chancy
from .floor import SqlFloor
from .graphile import GraphileWorker
from .pgboss import PgBoss
from .pgqueuer import PgQueuer
from .procrastinate import Procrastinate
from .rdbtasks import RDBTasks
from .tasksdb import TasksDB

ALL: dict[str, type[System]] = {
    SqlFloor.key: SqlFloor,
    RDBTasks.key: RDBTasks,
    TasksDB.key: TasksDB,
    Procrastinate.key: Procrastinate,
    PgQueuer.key: PgQueuer,
    Chancy.key: Chancy,
    GraphileWorker.key: GraphileWorker,
    PgBoss.key: PgBoss,
}

__all__ = [
    "ALL",
    "Chancy",
    "GraphileWorker",
    "PgBoss",
    "PgQueuer",
    "Procrastinate",
    "RDBTasks",
    "SqlFloor",
    "System",
    "TasksDB",
]
