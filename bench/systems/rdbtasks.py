"""django-rdbtasks, from this checkout."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from .base import BENCH_DIR, Context, System

REPO_DIR = BENCH_DIR.parent
TABLE = "django_rdbtasks_task"
#: Where PostgreSQL keeps the finished rows: it inherits TABLE, so every read
#: of TABLE reads it too (django_rdbtasks/db/postgresql/finished.py).
FINISHED_TABLE = "django_rdbtasks_finishedtask"

#: The READY rows as the partial indexes split them (migrations 0010 and 0014,
#: ``django_rdbtasks/db/ready_arms.py``): the harness's polls count each arm
#: off its own index. A count of ``status = 'READY'`` alone matches no index's
#: predicate and reads the whole table at every poll, which the drain's server
#: CPU then includes (on a table of a million finished rows, twice what the
#: workers cost the server).
READY_ARMS = (
    "status = 'READY' AND limit_key IS NULL AND requested_run_after IS NULL AND started_at IS NULL",
    "status = 'READY' AND limit_key IS NULL"
    " AND (requested_run_after IS NOT NULL OR started_at IS NOT NULL)",
    "status = 'READY' AND limit_key IS NOT NULL",
)


def ready_sources(condition: str = "") -> tuple[str, ...]:
    """The READY rows (and ``condition``) as ``FROM`` clauses, one a partial index."""
    return tuple(f"{TABLE} WHERE {arm}{condition}" for arm in READY_ARMS)


def count_ready(condition: str = "") -> str:
    """A sum of counts of READY rows (and ``condition``), one a partial index."""
    counts = (f"(SELECT count(*) FROM {source})" for source in ready_sources(condition))
    return "(" + " + ".join(counts) + ")"


# Logging every task costs CPU in the worker; every system runs with warnings only.
QUIET = ["--log-level", "WARNING"]


def project_python(context: Context) -> Path:
    """The project's virtualenv (``--rdbtasks-python``): django-rdbtasks' dependencies."""
    python = Path(context.options.get("rdbtasks_python") or REPO_DIR / ".venv/bin/python")
    if not python.exists():
        raise RuntimeError(f"no interpreter at {python} (see --rdbtasks-python)")
    return python


class RDBTasks(System):
    key = "rdbtasks"
    label = "django-rdbtasks"
    distribution = "django-rdbtasks"
    # BENCH_RDBTASKS_DATABASE: another name, for a run beside another one on the same server.
    database = os.environ.get("BENCH_RDBTASKS_DATABASE", "bench_rdbtasks")
    job_tables = [TABLE, FINISHED_TABLE]
    unfinished = (*ready_sources(), f"{TABLE} WHERE status = 'RUNNING'")
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
        self.python = project_python(self.context)
        # The peers are installed by pip, which writes their bytecode. The
        # checkout has none where PYTHONDONTWRITEBYTECODE is set (as on the
        # project's machines), and every worker and driver process would then
        # compile the package from source: 0.3 s of each worker's start and
        # about 20 ms of a driver's first enqueue. Written here as pip would.
        self.run([str(self.python), "-m", "compileall", "-q", str(REPO_DIR / "django_rdbtasks")])

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
            "bulk enqueue: bulk_enqueue, 1 call (multi-row INSERT) per chunk; in one"
            " transaction: task.enqueue() per task inside transaction.atomic()",
        ]
