"""What the harness needs from each system under comparison."""

from __future__ import annotations

import json
import os
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from core.envs import package_version
from core.pg import PgServer
from driverlib import RESULT_PREFIX

BENCH_DIR = Path(__file__).resolve().parents[1]


@dataclass
class Context:
    """Where the run keeps things, and how it was asked to behave."""

    server: PgServer
    envs_dir: Path
    logs_dir: Path
    reinstall_envs: bool = False
    options: dict[str, Any] = field(default_factory=dict)


def count_rows(sources: Sequence[str], cap: int | None = None) -> str:
    """A sum of counts of ``sources`` (``FROM`` clauses), each read up to ``cap`` rows."""
    if cap is None:
        counts = (f"(SELECT count(*) FROM {source})" for source in sources)
    else:
        counts = (
            f"(SELECT count(*) FROM (SELECT 1 FROM {source} LIMIT {cap}) AS c)"
            for source in sources
        )
    return "SELECT " + " + ".join(counts)


class System(ABC):
    key: ClassVar[str]  # short name, used on the command line and in the JSON
    label: ClassVar[str]  # name in the table
    distribution: ClassVar[str]  # the PyPI name whose version is reported
    database: ClassVar[str]
    #: Tables emptied between runs (their dependants go too, by CASCADE).
    job_tables: ClassVar[list[str]]
    #: Where the tasks queued or running are, as ``FROM`` clauses (``table WHERE
    #: ...``), one a partial index where the system has one; a drain ends when
    #: they hold no row (``unfinished_sql``).
    unfinished: ClassVar[tuple[str, ...]]
    failed_sql: ClassVar[str]
    #: What "bulk" enqueue means for this system, for the report.
    bulk_api: ClassVar[str]
    #: Drained with ``--slow-tasks`` rather than ``--tasks``: a peer whose rate would make
    #: a drain of ``--tasks`` take minutes (the rates are per second either way).
    slow: ClassVar[bool] = False
    #: Not a queue but the least one could do (the SQL floor): drained beside the
    #: others as their ceiling, never enqueued for timing nor probed for latency,
    #: and left out of the comparisons with the best peer.
    floor: ClassVar[bool] = False

    def __init__(self, context: Context) -> None:
        self.context = context
        self.python: Path | None = None

    @property
    def unfinished_sql(self) -> str:
        """Count of tasks queued or running."""
        return count_rows(self.unfinished)

    def unfinished_capped_sql(self, cap: int) -> str:
        """The count, exact below ``cap`` and at least ``cap`` above it: it reads
        at most ``cap`` rows of each source, however big the queue."""
        return count_rows(self.unfinished, cap)

    @classmethod
    def configurations(cls, context: Context) -> list[System]:
        """The configurations of it measured side by side, each its own row: one by default."""
        return [cls(context)]

    @property
    def ident(self) -> str:
        """Its key in the results: ``key``, or ``key:variant`` for a configuration of it."""
        return self.key

    @property
    def variant_title(self) -> str:
        """Which configuration of it this is, e.g. ``batch100 (--batch 100)``; or nothing."""
        return ""

    @property
    def title(self) -> str:
        """Its name in the table."""
        return f"{self.label} {self.variant_title}".strip()

    @property
    def reference(self) -> bool:
        """Whether it is django-rdbtasks (compared with the others) rather than a peer."""
        return False

    # -- set-up ----------------------------------------------------------------------

    @abstractmethod
    def prepare_env(self) -> None:
        """Make ``self.python`` an interpreter that has the system installed."""

    @abstractmethod
    def create_schema(self) -> None:
        """Create the system's tables in its freshly created database."""

    @property
    @abstractmethod
    def project_dir(self) -> Path:
        """The working directory of its workers and driver."""

    @property
    @abstractmethod
    def driver_argv(self) -> list[str]:
        """The command (without arguments) that runs its ``driverlib`` driver."""

    def notes(self) -> list[str]:
        """How it was configured, for the report."""
        return []

    def version(self) -> str:
        return package_version(self.interpreter, self.distribution)

    # -- workers ---------------------------------------------------------------------

    @abstractmethod
    def drain_commands(self, workers: int) -> list[list[str]]:
        """Commands that start ``workers`` worker processes to drain the queue."""

    @abstractmethod
    def idle_worker_commands(
        self, workers: int = 1, worker_args: Sequence[str] | None = None
    ) -> list[list[str]]:
        """Commands that start ``workers`` long-running worker processes, as in production.

        ``worker_args`` replaces the configuration's own worker options, for systems that
        have variants (django-rdbtasks); the others ignore it.
        """

    # -- helpers ---------------------------------------------------------------------

    @property
    def interpreter(self) -> str:
        if self.python is None:
            raise RuntimeError(f"{self.key}: prepare_env() has not run")
        return str(self.python)

    def env(self) -> dict[str, str]:
        environ = {**os.environ, **self.context.server.env(self.database)}
        # Each project's manage.py only sets a default, which the caller's shell could override.
        environ["DJANGO_SETTINGS_MODULE"] = "settings"
        environ["PYTHONUNBUFFERED"] = "1"  # worker logs in order, if it dies
        return environ

    def run(self, argv: list[str], *, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run a set-up command in the project dir; raise with its output if it fails."""
        result = subprocess.run(
            argv,
            cwd=self.project_dir,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            output = result.stdout + result.stderr
            raise RuntimeError(f"{self.key}: {' '.join(argv)} exited {result.returncode}\n{output}")
        return result

    def drive(self, *args: str, timeout: float = 600) -> dict[str, Any]:
        """Run the driver and return the JSON result it printed."""
        result = self.run([*self.driver_argv, *args], timeout=timeout)
        for line in reversed(result.stdout.splitlines()):
            if line.startswith(RESULT_PREFIX):
                return json.loads(line[len(RESULT_PREFIX) :])
        raise RuntimeError(
            f"{self.key}: the driver printed no result\n{result.stdout}{result.stderr}"
        )
