"""Chancy 0.26: PostgreSQL-only, asyncio workers on psycopg 3, LISTEN/NOTIFY.

Its queue (bench/peers/chancy_app.py) uses the ``AsyncExecutor`` with its
default concurrency (100 jobs at once per worker), ``eager_polling`` and
notifications, Chancy's documented options for many short IO-bound jobs
(https://tkte.ch/chancy/chancy.executors.asyncex.html,
https://tkte.ch/chancy/chancy.queue.html). Chancy has no drain mode: the
worker script's ``--drain`` stops a worker once its executors are empty and no
job is pending (bench/peers/chancy_worker.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.envs import ensure_env

from .base import BENCH_DIR, System

REQUIREMENTS = ["chancy==0.26.*", "psycopg[binary]"]


class Chancy(System):
    key = "chancy"
    label = "Chancy"
    distribution = "chancy"
    database = "bench_chancy"
    job_tables = ["chancy_jobs"]
    # A worker marks jobs 'running' when it fetches them and writes their end state
    # in batches, once a second (Worker.send_outgoing_interval): a job counts as
    # finished once that update has committed.
    unfinished = ("chancy_jobs WHERE state IN ('pending', 'running', 'retrying')",)
    failed_sql = "SELECT count(*) FROM chancy_jobs WHERE state = 'failed'"
    bulk_api = "Chancy.push_many (one INSERT per job, one transaction per call)"

    @property
    def project_dir(self) -> Path:
        return BENCH_DIR / "peers"

    @property
    def driver_argv(self) -> list[str]:
        return [self.interpreter, "chancy_driver.py"]

    def prepare_env(self) -> None:
        self.python = ensure_env(
            self.context.envs_dir / self.key, REQUIREMENTS, reinstall=self.context.reinstall_envs
        )

    def create_schema(self) -> None:
        self.run([self.interpreter, "chancy_worker.py", "setup"])

    def drain_commands(self, workers: int) -> list[list[str]]:
        return [[self.interpreter, "chancy_worker.py", "work", "--drain"]] * workers

    def idle_worker_commands(
        self, workers: int = 1, worker_args: Sequence[str] | None = None
    ) -> list[list[str]]:
        return [[self.interpreter, "chancy_worker.py", "work"]] * workers

    def notes(self) -> list[str]:
        return [
            "Worker processes (asyncio), queue with AsyncExecutor, default concurrency"
            " (100), eager_polling, notifications on, default plugins, log level WARNING;"
            " drain: the worker stops once its executor is empty and nothing is pending",
            "job updates are written in batches every 1 s (Chancy's design): a drain's"
            " end waits for the last batch",
            "bulk enqueue: push_many, 1 call (1 transaction) per chunk; in one transaction:"
            " push_ex per job on one cursor inside conn.transaction()",
        ]
