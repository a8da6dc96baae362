"""PgQueuer 1.6: PostgreSQL-only, asyncio workers on asyncpg, LISTEN/NOTIFY.

Configured as its documentation says for throughput
(https://janbjorge.github.io/pgqueuer/guides/performance-tuning/): the schema of
``pgq install`` (durability ``durable``, the default: the queue and its log are
WAL-logged, like every other system here) and the autovacuum settings of ``pgq
autovac``; one asyncpg connection per worker process; ``pgq run`` (uvloop) in
``--mode drain`` for the drain. Two configurations side by side, each its own row:
``--batch-size 100``, what the tuning guide says for short jobs ("Increase
``batch_size`` when jobs are short-lived"), and ``--batch-size 10``, ``pgq run``'s
default and its own benchmark tool's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.envs import ensure_env

from .base import BENCH_DIR, Context, System

# typer: `pgq run` of PgQueuer 1.6 fails at start with typer 0.29 (its --log-level
# reaches the logger as a str: "'str' object has no attribute 'name'"); 0.19 is the
# version PgQueuer's own lock file tests with.
REQUIREMENTS = ["pgqueuer[asyncpg]==1.6.*", "uvloop", "typer==0.19.*"]
#: The configurations measured: name and ``--batch-size``.
BATCH_SIZES = (("batch100", 100), ("batch10", 10))
# Logging every job costs CPU; every system runs with warnings only.
QUIET = ["--log-level", "WARNING"]
FACTORY = "pgqueuer_app:create_worker"


class PgQueuer(System):
    key = "pgqueuer"
    label = "PgQueuer"
    distribution = "pgqueuer"
    database = "bench_pgqueuer"
    # A finished job's row is deleted from pgqueuer and logged in pgqueuer_log.
    job_tables = ["pgqueuer", "pgqueuer_log", "pgqueuer_statistics"]
    unfinished = ("pgqueuer WHERE status IN ('queued', 'picked')",)
    # A job that raised is deleted too (on_failure="delete", the default) and logged
    # as 'exception'; 'failed' is a job held for inspection (on_failure="hold").
    failed_sql = (
        "SELECT (SELECT count(*) FROM pgqueuer WHERE status = 'failed')"
        " + (SELECT count(*) FROM pgqueuer_log WHERE status IN ('exception', 'failed'))"
    )
    bulk_api = "Queries.enqueue with lists (one INSERT ... SELECT unnest per call)"

    def __init__(self, context: Context, variant: str = "batch10", batch_size: int = 10) -> None:
        super().__init__(context)
        self.variant = variant
        self.batch_size = batch_size

    @classmethod
    def configurations(cls, context: Context) -> list[System]:
        return [cls(context, name, size) for name, size in BATCH_SIZES]

    @property
    def ident(self) -> str:
        return f"{self.key}:{self.variant}"

    @property
    def variant_title(self) -> str:
        return f"{self.variant} (--batch-size {self.batch_size})"

    @property
    def project_dir(self) -> Path:
        return BENCH_DIR / "peers"

    @property
    def driver_argv(self) -> list[str]:
        return [self.interpreter, "pgqueuer_driver.py"]

    @property
    def pgq(self) -> str:
        return str(Path(self.interpreter).parent / "pgq")

    def prepare_env(self) -> None:
        self.python = ensure_env(
            self.context.envs_dir / self.key, REQUIREMENTS, reinstall=self.context.reinstall_envs
        )

    def env(self) -> dict[str, str]:
        # asyncpg.connect() and the pgq command read the libpq variables.
        server = self.context.server
        return {
            **super().env(),
            "PGHOST": server.host,
            "PGPORT": str(server.port),
            "PGUSER": server.user,
            "PGPASSWORD": server.password,
            "PGDATABASE": self.database,
        }

    def create_schema(self) -> None:
        self.run([self.pgq, "install"])
        self.run([self.pgq, "autovac"])

    def _worker(self, *extra: str) -> list[str]:
        return [self.pgq, "run", FACTORY, "--batch-size", str(self.batch_size), *QUIET, *extra]

    def drain_commands(self, workers: int) -> list[list[str]]:
        # --mode drain: exit once no job is queued and the running ones are done.
        return [self._worker("--mode", "drain")] * workers

    def idle_worker_commands(
        self, workers: int = 1, worker_args: Sequence[str] | None = None
    ) -> list[list[str]]:
        return [self._worker()] * workers

    def notes(self) -> list[str]:
        return [
            f"pgq run {FACTORY} --batch-size {self.batch_size} (uvloop), one QueueManager"
            " and one asyncpg connection per process, async no-op entrypoint, log level"
            " WARNING; drain: --mode drain",
            "schema: pgq install (durable), then pgq autovac; idle worker wakes on"
            " LISTEN/NOTIFY (its insert trigger), polling every 30 s as a fallback",
            "bulk enqueue: Queries.enqueue with lists, 1 call per chunk;"
            " in one transaction: Queries.enqueue per job inside asyncpg's transaction()",
        ]
