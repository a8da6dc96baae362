"""The machine's commit limit: pgbench, one single-row UPDATE per transaction.

Every task a queue runs costs it at least one commit (the claim or the
completion), and with PostgreSQL's default durability a commit waits for its WAL
to reach the disk. pgbench doing nothing but single-row UPDATEs, each its own
transaction, with as many clients as the queue has worker processes, is the
rate a client of this server can commit at: a drain rate divided by it says how
close a queue comes to the machine's limit (above 100 % a queue commits fewer
than once per task).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .pg import PgServer, settle

DATABASE = "bench_pgbench"
SCALE = 1  # pgbench_accounts gets 100,000 rows per unit of scale
#: One transaction per UPDATE of one random row (pgbench runs each line as a statement,
#: in autocommit): nothing but the commit and a primary-key lookup.
SCRIPT = (
    "\\set aid random(1, 100000 * :scale)\n"
    "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n"
)
#: How it is run, for the report (N: as many clients as worker processes).
COMMAND = "pgbench -n -M prepared -c N -j N -T SECONDS -f SCRIPT"
TABLES = ["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"]


@dataclass(frozen=True)
class CommitLimitRun:
    clients: int
    seconds: float  # pgbench -T
    transactions: int
    tps: float  # pgbench's figure, without its connection time
    latency_ms: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_pgbench(path: str | None) -> str:
    found = path or shutil.which("pgbench") or "/usr/bin/pgbench"
    if not Path(found).exists():
        raise RuntimeError(f"no pgbench at {found} (see --pgbench)")
    return found


class PgBench:
    """Runs pgbench against its own throwaway database on the server under test."""

    def __init__(self, server: PgServer, executable: str, work_dir: Path) -> None:
        self.server = server
        self.executable = executable
        self.work_dir = work_dir
        self.script = work_dir / "pgbench-update.sql"

    def _argv(self, *args: str) -> list[str]:
        return [
            self.executable,
            "-h",
            self.server.host,
            "-p",
            str(self.server.port),
            "-U",
            self.server.user,
            *args,
            DATABASE,
        ]

    def _run(self, argv: list[str], timeout: float) -> str:
        env = dict(os.environ)
        if self.server.password:
            env["PGPASSWORD"] = self.server.password
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
        output = result.stdout + result.stderr
        log = self.work_dir / "pgbench.log"
        with log.open("a") as handle:
            handle.write(f"$ {' '.join(argv)}\n{output}\n")
        if result.returncode != 0:
            raise RuntimeError(f"pgbench exited {result.returncode}\n{output}")
        return output

    def version(self) -> str:
        return subprocess.run(
            [self.executable, "--version"], capture_output=True, text=True
        ).stdout.strip()

    def set_up(self) -> None:
        """A fresh database with pgbench's tables at scale 1, and the UPDATE script."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.script.write_text(SCRIPT)
        self.server.recreate_database(DATABASE)
        self._run(self._argv("-i", "-s", str(SCALE), "-q"), timeout=300)

    def measure(self, clients: int, seconds: float) -> CommitLimitRun:
        with self.server.connect(DATABASE) as conn:
            # As before every timed phase of the queues: statistics, and no pending WAL.
            settle(conn, TABLES, vacuum=True)
        output = self._run(
            self._argv(
                "-n",  # the harness has vacuumed; pgbench's own vacuum would be timed
                "-M",
                "prepared",
                "-c",
                str(clients),
                "-j",
                str(clients),
                "-T",
                f"{seconds:g}",
                "-f",
                str(self.script),
            ),
            timeout=seconds + 120,
        )
        return parse(output, clients, seconds)

    def drop(self) -> None:
        self.server.drop_database(DATABASE)


def parse(output: str, clients: int, seconds: float) -> CommitLimitRun:
    tps = re.search(r"^tps = ([\d.]+) \((?:without|excluding)", output, re.MULTILINE)
    processed = re.search(r"number of transactions actually processed: (\d+)", output)
    latency = re.search(r"latency average = ([\d.]+) ms", output)
    failed = re.search(r"number of failed transactions: (\d+)", output)
    if tps is None or processed is None:
        raise RuntimeError(f"could not read pgbench's output:\n{output}")
    if failed is not None and int(failed.group(1)) > 0:
        raise RuntimeError(f"pgbench had failed transactions:\n{output}")
    return CommitLimitRun(
        clients=clients,
        seconds=seconds,
        transactions=int(processed.group(1)),
        tps=float(tps.group(1)),
        latency_ms=float(latency.group(1)) if latency else None,
    )
