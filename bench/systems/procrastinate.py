"""Procrastinate 3.10: PostgreSQL-only, asyncio workers, LISTEN/NOTIFY."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.envs import ensure_env

from .base import BENCH_DIR, System

REQUIREMENTS = ["procrastinate==3.10.*", "psycopg[binary]"]
CONCURRENCY = 10
# `python -m` puts the working directory (bench/peers) on sys.path for --app.
# Logging every job at INFO (its default) costs CPU; every system runs with warnings only.
CLI = ["-m", "procrastinate", "--app=procrastinate_app.app", "--log-level=warning"]


class Procrastinate(System):
    key = "procrastinate"
    label = "Procrastinate"
    distribution = "procrastinate"
    database = "bench_procrastinate"
    job_tables = ["procrastinate_jobs", "procrastinate_events"]
    unfinished = ("procrastinate_jobs WHERE status IN ('todo', 'doing')",)
    failed_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'failed'"
    bulk_api = "batch_defer"
    slow = True

    @property
    def project_dir(self) -> Path:
        return BENCH_DIR / "peers"

    @property
    def driver_argv(self) -> list[str]:
        return [self.interpreter, "procrastinate_driver.py"]

    def prepare_env(self) -> None:
        self.python = ensure_env(
            self.context.envs_dir / self.key, REQUIREMENTS, reinstall=self.context.reinstall_envs
        )

    def create_schema(self) -> None:
        self.run([self.interpreter, *CLI, "schema", "--apply"])

    def _worker(self, *extra: str) -> list[str]:
        return [self.interpreter, *CLI, "worker", f"--concurrency={CONCURRENCY}", *extra]

    def drain_commands(self, workers: int) -> list[list[str]]:
        # --one-shot: exit once no job is left, rather than wait for more.
        return [self._worker("--one-shot")] * workers

    def idle_worker_commands(
        self, workers: int = 1, worker_args: Sequence[str] | None = None
    ) -> list[list[str]]:
        return [self._worker()] * workers

    def notes(self) -> list[str]:
        return [
            f"procrastinate worker processes, --concurrency {CONCURRENCY}, async tasks,"
            " log level warning",
            "idle worker wakes on LISTEN/NOTIFY (its default), polling every 5 s as a fallback",
            "bulk enqueue: batch_defer, 1 call per chunk; in one transaction: defer per job"
            " on an external psycopg connection (configure(connection=...))",
        ]
