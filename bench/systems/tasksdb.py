"""django-tasks-db 0.13: the database backend of the Tasks framework's backport."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.envs import ensure_env

from .base import BENCH_DIR, System

REQUIREMENTS = [
    "django>=5.2,<5.3",
    "django-tasks==0.12.*",
    "django-tasks-db==0.13.*",
    "psycopg[binary]",
]
TABLE = "django_tasks_database_dbtaskresult"
#: ``db_worker --interval`` default: how long an idle worker sleeps between polls.
DEFAULT_INTERVAL = 1.0
# Logging every task costs CPU in the worker; every system runs with warnings only.
QUIET = ["--verbosity", "0"]


class TasksDB(System):
    key = "tasksdb"
    label = "django-tasks-db"
    distribution = "django-tasks-db"
    database = "bench_tasksdb"
    job_tables = [TABLE]
    unfinished = (f"{TABLE} WHERE status IN ('READY', 'RUNNING')",)
    failed_sql = f"SELECT count(*) FROM {TABLE} WHERE status = 'FAILED'"
    bulk_api = "bulk_create on its model (it has no bulk enqueue API)"
    slow = True

    @property
    def project_dir(self) -> Path:
        return BENCH_DIR / "peers" / "tasksdb_project"

    @property
    def driver_argv(self) -> list[str]:
        return [self.interpreter, "driver.py"]

    def prepare_env(self) -> None:
        self.python = ensure_env(
            self.context.envs_dir / self.key, REQUIREMENTS, reinstall=self.context.reinstall_envs
        )

    def create_schema(self) -> None:
        self.run([self.interpreter, "manage.py", "migrate", "--verbosity", "0"])

    def drain_commands(self, workers: int) -> list[list[str]]:
        # --batch exits once nothing is ready; --no-startup-delay skips a random
        # sleep of up to 1 s that spreads out workers started together, which
        # would be counted as drain time here.
        command = [
            self.interpreter,
            "manage.py",
            "db_worker",
            "--batch",
            "--no-startup-delay",
            *QUIET,
        ]
        return [command] * workers

    def idle_worker_commands(
        self, workers: int = 1, worker_args: Sequence[str] | None = None
    ) -> list[list[str]]:
        return [[self.interpreter, "manage.py", "db_worker", *QUIET]] * workers

    def notes(self) -> list[str]:
        return [
            "db_worker processes, CONN_MAX_AGE=None (persistent connection), --verbosity 0",
            f"idle worker polls every {DEFAULT_INTERVAL:g} s (db_worker's default --interval)",
            "bulk enqueue: bulk_create on DBTaskResult, 1 INSERT per chunk (no public bulk API);"
            " in one transaction: task.enqueue() per task inside transaction.atomic()",
        ]
