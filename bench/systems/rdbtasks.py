"""django-rdbtasks, from this checkout."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

import psycopg
from core.pg import scalar

from .base import BENCH_DIR, Context, System

REPO_DIR = BENCH_DIR.parent
TABLE = "django_rdbtasks_task"
# Logging every task costs CPU in the worker; every system runs with warnings only.
QUIET = ["--log-level", "WARNING"]


class RDBTasks(System):
    key = "rdbtasks"
    label = "django-rdbtasks"
    distribution = "django-rdbtasks"
    database = "bench_rdbtasks"
    job_tables = [TABLE]
    # Two counts, so that each matches one of the partial indexes on status: a
    # count over the whole table would cost the harness a scan per poll in the
    # backlog mode, where the table has a million finished rows.
    unfinished_sql = (
        f"SELECT (SELECT count(*) FROM {TABLE} WHERE status = 'READY')"
        f" + (SELECT count(*) FROM {TABLE} WHERE status = 'RUNNING')"
    )
    failed_sql = f"SELECT count(*) FROM {TABLE} WHERE status = 'FAILED'"
    bulk_api = "django_rdbtasks.backend.bulk_enqueue"

    def __init__(
        self, context: Context, variant: str = "", variant_args: Sequence[str] = ()
    ) -> None:
        """``variant`` names a configuration: ``variant_args`` for ``runworkers``."""
        super().__init__(context)
        self.variant = variant
        self.variant_args = list(variant_args)

    @property
    def ident(self) -> str:
        return f"{self.key}:{self.variant}" if self.variant else self.key

    @property
    def variant_title(self) -> str:
        if not self.variant:
            return ""
        return f"{self.variant} ({' '.join(self.variant_args) or 'no flags'})"

    @property
    def reference(self) -> bool:
        return True

    @property
    def project_dir(self) -> Path:
        return BENCH_DIR / "rdbtasks_project"

    @property
    def driver_argv(self) -> list[str]:
        return [self.interpreter, "driver.py"]

    @property
    def common_args(self) -> list[str]:
        """``runworkers`` options every variant gets, from ``--rdbtasks-worker-args``."""
        return shlex.split(self.context.options.get("rdbtasks_worker_args", ""))

    @property
    def worker_args(self) -> list[str]:
        """This variant's ``runworkers`` options (e.g. ``--batch 100``)."""
        return [*self.variant_args, *self.common_args]

    def prepare_env(self) -> None:
        # The project's own virtualenv; the package is imported from the checkout.
        self.python = Path(
            self.context.options.get("rdbtasks_python") or REPO_DIR / ".venv/bin/python"
        )
        if not self.python.exists():
            raise RuntimeError(
                f"{self.key}: no interpreter at {self.python} (see --rdbtasks-python)"
            )

    def version(self) -> str:
        installed = super().version()
        return installed if installed != "not installed" else "checkout"

    def create_schema(self) -> None:
        self.run([self.interpreter, "manage.py", "migrate", "--verbosity", "0"])

    def drain_commands(self, workers: int) -> list[list[str]]:
        # One supervisor that forks the worker processes; --burst exits once
        # nothing is runnable.
        return [
            [
                self.interpreter,
                "manage.py",
                "runworkers",
                "--processes",
                str(workers),
                "--burst",
                *QUIET,
                *self.worker_args,
            ]
        ]

    def idle_worker_commands(
        self, workers: int = 1, worker_args: Sequence[str] | None = None
    ) -> list[list[str]]:
        args = self.worker_args if worker_args is None else [*worker_args, *self.common_args]
        return [
            [
                self.interpreter,
                "manage.py",
                "runworkers",
                "--processes",
                str(workers),
                *QUIET,
                *args,
            ]
        ]

    def notes(self) -> list[str]:
        args = " ".join(self.worker_args) or "no flags"
        return [
            f"runworkers --processes N, {args}, log level WARNING, CONN_MAX_AGE left at 0",
            "bulk enqueue: bulk_enqueue, 1 call (multi-row INSERT) per chunk",
        ]

    def insert_backlog(self, conn: psycopg.Connection, rows: int) -> None:
        """Add ``rows`` finished tasks, as a table that has run for a while would have.

        The rows are copies of a task that a worker really ran (so they have
        the shape and width the package gives them, whatever the model grows
        into), made with one INSERT ... SELECT generate_series. Their primary
        keys are built like the model's UUIDv7 but dated a day back, so that
        they sort before the tasks enqueued next, as old rows would.
        """
        template = scalar(conn, f"SELECT count(*) FROM {TABLE} WHERE status = 'SUCCESSFUL'")
        if template == 0:
            raise RuntimeError(f"{self.key}: insert_backlog needs one finished task to copy")
        columns = [
            name
            for (name,) in conn.execute(
                # Generated columns compute themselves; they cannot be inserted into.
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
                " AND table_schema = current_schema() AND is_generated = 'NEVER'"
                " ORDER BY ordinal_position",
                (TABLE,),
            )
            if name != "id"
        ]
        copied = ", ".join(f"t.{name}" for name in columns)
        conn.execute(
            f"""
            INSERT INTO {TABLE} (id, {", ".join(columns)})
            SELECT
                (lpad(to_hex(base.ms + g / 1000), 12, '0') || '7' || lpad(to_hex(g %% 4096), 3, '0')
                    || '8' || lpad(to_hex(g), 15, '0'))::uuid,
                {copied}
            FROM (SELECT * FROM {TABLE} WHERE status = 'SUCCESSFUL' LIMIT 1) AS t,
                 (SELECT (extract(epoch FROM now() - interval '1 day') * 1000)::bigint AS ms)
                     AS base,
                 generate_series(1, %s) AS g
            """,
            (rows,),
        )
