"""The two-commit SQL floor: the ceiling line of the drain table, not a queue.

A plain psycopg loop on the project's virtualenv (bench/peers/floor_worker.py):
claim up to 100 ready rows with ``FOR UPDATE SKIP LOCKED`` and commit, mark them
done and commit, in W processes, on a table of the same shape in every run. It
runs no task and keeps no result, history, lease or retry: no queue with leases
on this server drains faster than it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .base import BENCH_DIR, System
from .rdbtasks import project_python

TABLE = "bench_floor_task"


class SqlFloor(System):
    key = "floor"
    label = "SQL floor (not a queue): claim 100 SKIP LOCKED, commit; mark done, commit"
    distribution = "psycopg"
    database = "bench_floor"
    job_tables = [TABLE]
    # 'ready' through its partial index; 'running' rows are few (100 per process).
    unfinished = (f"{TABLE} WHERE status = 'ready'", f"{TABLE} WHERE status = 'running'")
    failed_sql = "SELECT 0"
    bulk_api = "INSERT ... SELECT generate_series (fills the table; not timed)"
    floor = True

    @property
    def project_dir(self) -> Path:
        return BENCH_DIR / "peers"

    @property
    def driver_argv(self) -> list[str]:
        return [self.interpreter, "floor_driver.py"]

    def prepare_env(self) -> None:
        self.python = project_python(self.context)

    def version(self) -> str:
        return ""  # the label says what it is; psycopg's version is in the notes

    def create_schema(self) -> None:
        self.run([self.interpreter, "floor_worker.py", "setup"])

    def drain_commands(self, workers: int) -> list[list[str]]:
        return [[self.interpreter, "floor_worker.py", "work"]] * workers

    def idle_worker_commands(
        self, workers: int = 1, worker_args: Sequence[str] | None = None
    ) -> list[list[str]]:
        raise RuntimeError("the SQL floor has no idle worker: it is drained only")

    def notes(self) -> list[str]:
        return [
            f"floor_worker.py per process (psycopg {super().version()}, prepared statements,"
            " one connection): claim up to 100 ready rows FOR UPDATE SKIP LOCKED, commit;"
            " mark them done, commit; exits when a claim finds nothing",
            f"table {TABLE}: id, task, args, status, attempts, enqueued_at, claimed_at,"
            " finished_at; primary key and a partial index on id WHERE status = 'ready'",
        ]
