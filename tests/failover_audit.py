"""What a failover test counts, shared by the failover tests (``tests/test_failover.py``,
``tests/test_patroni.py``): the task they drain, the producer process, and the audit.

What is counted is what the task bodies did, not statuses: each run appends
one line (task id, attempt, pid, worker id) to a file with ``O_APPEND``,
outside the database's fate, then inserts a row in the database. The audit
(``audit``) checks, on the new primary:

- every enqueue the producer saw commit is there, once, and SUCCESSFUL;
- every task ran at least once (the file), and the run that succeeded left its
  database row (an acknowledged commit survived the failover: synchronous
  replication);
- each task's history is possible: attempts in order, one SUCCESSFUL entry,
  last, written by the last claim (fencing), a version that adds up;
- every run in the file is an entry of the history (none unaccounted for),
  and every run but the last is a failover casualty: LOST or retried after a
  database error, by a claim made before the promotion.

``losses`` counts instead what an asynchronous promotion lost, without
failing on it. ``audit_ticks`` checks a cron job fired each tick once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django_rdbtasks.compat import HAS_DJANGO_TASKS
from django_rdbtasks.states import AttemptOutcome, TaskStatus
from tests.conftest import ROOT
from tests.testapp.models import SideEffect

if HAS_DJANGO_TASKS:
    from django.tasks import task
else:
    from django_tasks import task

#: Runs a query on the current primary: (sql, params) -> rows.
Query = Callable[[str, tuple], list[tuple]]

#: Enqueued before the workers start; the producer then goes on, paced, until stopped.
INITIAL = 1500
PACE = 0.004
BODY_SECONDS = 0.01
#: The cron job the failover tests run beside the drain: a tick every 2 s.
TICK_JOB = "failover-tick"
TICK_CRON = "*/2 * * * * *"


@task(takes_context=True, max_attempts=8, backoff=0)
def failover_step(context: Any, n: int) -> int:
    """One run: a line in the file (outside the database), then a row in it."""
    result = context.task_result
    worker_id = result.worker_ids[-1]
    line = f"{result.id} {context.attempt} {os.getpid()} {worker_id}\n"
    _append(os.environ["RDBTASKS_FAILOVER_LOG"], line)
    SideEffect.objects.create(key=str(result.id), pid=os.getpid(), worker_id=worker_id)
    # Its row committed (autocommit) and the server said so: what an
    # asynchronous promotion may lose all the same.
    _append(os.environ["RDBTASKS_FAILOVER_LOG"] + ".acked", f"{result.id} {worker_id}\n")
    time.sleep(BODY_SECONDS)
    return n


@task(takes_context=True, max_attempts=8, backoff=0)
def failover_tick(context: Any) -> None:
    """The cron job's task: its run is a line in a file of its own."""
    _append(os.environ["RDBTASKS_FAILOVER_LOG"] + ".ticks", f"{context.task_result.id}\n")


@task(takes_context=True, max_attempts=4, backoff=0)
def failover_hold(context: Any, stop_path: str) -> None:
    """Queries its own connection until ``stop_path`` exists (at most a minute).

    When a query fails, the time and the error go to ``stop_path.noticed``
    and the attempt fails with it (it is retried).
    """
    from django.db import DatabaseError, connection

    _append(f"{stop_path}.started", f"{context.attempt} {time.time()}\n")
    deadline = time.monotonic() + 60
    while not os.path.exists(stop_path) and time.monotonic() < deadline:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        except DatabaseError as exc:
            _append(f"{stop_path}.noticed", f"{context.attempt} {time.time()} {exc!r}\n")
            raise
        time.sleep(0.1)


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def produce(log_path: str, stop_path: str, initial: int = INITIAL) -> None:
    """The producer process: one task per transaction, each outcome logged.

    ``ok N ID`` once the commit returned; ``err N`` when it raised (the commit
    may or may not have landed). A failed enqueue is not retried: the next
    number is enqueued once the database answers again.
    """
    from django.db import DatabaseError, connection, transaction

    n = 0
    with open(log_path, "a", buffering=1) as log:
        while not os.path.exists(stop_path):
            n += 1
            try:
                with transaction.atomic():
                    result = failover_step.enqueue(n)
            except DatabaseError as exc:
                log.write(f"err {n} {type(exc).__name__}\n")
                try:
                    connection.close()
                except DatabaseError:
                    pass
                time.sleep(0.1)
                continue
            log.write(f"ok {n} {result.id}\n")
            if n >= initial:
                time.sleep(PACE)


class Producer:
    """The producer (``produce``) in a process of its own, with ``env`` (its settings)."""

    def __init__(self, directory: Path, env: dict[str, str], initial: int = INITIAL) -> None:
        self.log_path = directory / "producer.log"
        self.stop_path = directory / "producer.stop"
        self.log_path.touch()
        code = (
            "import django; django.setup(); from tests.failover_audit import produce; "
            f"produce({str(self.log_path)!r}, {str(self.stop_path)!r}, {initial})"
        )
        self._err = open(directory / "producer.stderr", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            cwd=ROOT,
            stdout=self._err,
            stderr=subprocess.STDOUT,
        )

    def outcomes(self) -> tuple[dict[int, str], set[int]]:
        """Enqueues that committed (number -> task id), and those that raised."""
        acked: dict[int, str] = {}
        failed: set[int] = set()
        for line in self.log_path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "ok":
                acked[int(parts[1])] = parts[2]
            elif len(parts) >= 2 and parts[0] == "err":
                failed.add(int(parts[1]))
        return acked, failed

    def finish(self) -> None:
        self.stop_path.touch()
        assert self.process.wait(60) == 0, (self.log_path.parent / "producer.stderr").read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._err.close()


@dataclass(frozen=True)
class Run:
    task_id: str
    attempt: int
    pid: int
    worker_id: str
    position: int  # its line number in the file


def runs_in(path: Path) -> list[Run]:
    runs = []
    for position, line in enumerate(path.read_text().splitlines()):
        task_id, attempt, pid, worker_id = line.split(" ")
        runs.append(Run(task_id, int(attempt), int(pid), worker_id, position))
    return runs


def lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


DATABASE_ERRORS = ("OperationalError", "InterfaceError", "DatabaseError")


def audit(
    query: Query,
    runs: list[Run],
    acked: dict[int, str],
    failed: set[int],
    promoted_at: Any,
) -> str:
    rows = query(
        "SELECT id::text, status, attempts, version, worker_id, history, args "
        "FROM django_rdbtasks_task WHERE job_name = ''",
        (),
    )
    tasks = {row[0]: row for row in rows}
    by_number = Counter(row[6][0] for row in rows)
    # Every enqueue that committed is there, once, and finished once.
    missing = [n for n, task_id in acked.items() if task_id not in tasks]
    assert not missing, f"{len(missing)} committed enqueues lost, e.g. {missing[:5]}"
    assert all(count == 1 for count in by_number.values())
    assert {row[1] for row in rows} == {TaskStatus.SUCCESSFUL}, Counter(row[1] for row in rows)
    # Enqueues whose commit raised: any of them may have landed (then it ran).
    landed = sum(1 for n in failed if n in by_number)
    assert len(rows) == len(acked) + landed

    runs_of: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        runs_of[run.task_id].append(run)
    assert set(runs_of) <= set(tasks), "a run of a task the new primary does not have"
    never_ran = set(tasks) - set(runs_of)
    assert not never_ran, f"{len(never_ran)} tasks SUCCESSFUL without a run"

    effects = {
        (key, worker_id)
        for key, worker_id in query(f"SELECT key, worker_id FROM {SideEffect._meta.db_table}", ())
    }
    duplicated: dict[str, int] = {}
    stale: list[str] = []
    for task_id, (_, _, attempts, version, worker_id, history, _) in tasks.items():
        if isinstance(history, str):
            history = json.loads(history)
        claims = [(run.attempt, run.worker_id) for run in runs_of[task_id]]
        try:
            stale += check_history(task_id, attempts, version, worker_id, history, promoted_at)
            # Every attempt spent has its entry, a lost one taken over included.
            assert attempts == len(history), "an attempt spent without its entry"
            entries = {(entry["attempt"], entry["worker_id"]) for entry in history}
            # One run per claim, and every run is in the history: none unaccounted for.
            assert len(claims) == len(set(claims)), "two runs of one claim"
            assert set(claims) <= entries, "a run missing from the history"
            # The run that succeeded is in the file, and its database row
            # (committed before the body returned) survived the failover.
            assert (attempts, worker_id) in claims, "the successful run is not in the file"
            assert (task_id, worker_id) in effects, "the successful run's row was lost"
        except AssertionError as exc:
            brief = [{k: v for k, v in e.items() if k != "traceback"} for e in history]
            raise AssertionError(
                f"{exc}\ntask {task_id}: attempts={attempts} version={version} "
                f"worker={worker_id}\nhistory={brief}\n"
                f"runs={[(r.position, r.attempt, r.worker_id) for r in runs_of[task_id]]}"
            ) from exc
        if len(claims) > 1:
            duplicated[task_id] = len(claims) - 1
    # Every run but the last was in flight at the failover: a lane whose claim
    # connection failed also connects its tasks' thread again, to a server that
    # takes writes, before its next task runs, so no task claimed on the new
    # primary spends an attempt finding the old one (through HAProxy, still
    # reachable until its checks fail).
    assert not stale, f"promoted at {promoted_at.isoformat()}: {Counter(stale)}"
    return (
        f"{len(rows)} tasks ({len(acked)} acknowledged, {landed} of {len(failed)} "
        f"failed enqueues landed), {len(runs)} runs, {sum(duplicated.values())} duplicate "
        f"runs over {len(duplicated)} tasks, {len(stale)} attempts failed on a stale "
        f"task connection"
    )


def check_history(
    task_id: str, attempts: int, version: int, worker_id: str, history: list, promoted_at: Any
) -> list[str]:
    """One possible history: the last claim succeeded, every earlier one is a casualty.

    Returns the lanes whose attempt, claimed on the new primary, failed on a
    database error: a task connection the lane opened to the dead primary.
    """
    from datetime import datetime

    numbers = [entry["attempt"] for entry in history]
    assert numbers == sorted(set(numbers)), (task_id, history)
    last = history[-1]
    # Fencing: the result was written by the last claim, and by nobody else.
    assert last["outcome"] == AttemptOutcome.SUCCESSFUL, (task_id, history)
    assert (last["attempt"], last["worker_id"]) == (attempts, worker_id), (task_id, history)
    lost = 0
    stale = []
    for entry in history[:-1]:
        database_error = entry["outcome"] == AttemptOutcome.RETRY and entry.get(
            "exception_class_path", ""
        ).endswith(DATABASE_ERRORS)
        assert entry["outcome"] == AttemptOutcome.LOST or database_error, (task_id, entry)
        if datetime.fromisoformat(entry["started_at"]) >= promoted_at:
            # Claimed on the new primary, yet its body met the old one.
            assert database_error, (task_id, entry)
            error = entry.get("traceback", "").strip().splitlines()[-1:]
            stale.append(f"{entry['worker_id']} at {entry['started_at']}: {error}")
        lost += entry["outcome"] == AttemptOutcome.LOST
    # Each claim adds one to the version and each outcome written one more; a
    # lost claim has no outcome, a released one gives its attempt back. A lost
    # attempt whose entry is missing (below) is a lost claim too.
    lost += attempts - len(history)
    assert (version + lost) % 2 == 0 and version >= 2 * attempts - lost, (task_id, version)
    return stale


def audit_frozen(query: Query, runs: list[Run], pid: int | None, held: set[str], log: str) -> None:
    """The frozen process's claims were taken over; what it wrote on resuming matched nothing."""
    rows = query(
        "SELECT id::text, worker_id, attempts, history FROM django_rdbtasks_task "
        "WHERE id = ANY(%s::uuid[])",
        (list(held),),
    )
    assert len(rows) == len(held)
    for task_id, worker_id, attempts, history in rows:
        assert attempts == len(history), (task_id, history)
        if isinstance(history, str):
            history = json.loads(history)
        assert f":{pid}:" not in worker_id, (task_id, history)
        # Its lost attempt is in the history.
        assert any(
            entry["outcome"] == AttemptOutcome.LOST and f":{pid}:" in entry["worker_id"]
            for entry in history
        ), (task_id, history)
    ran_frozen = [run for run in runs if run.pid == pid and run.task_id in held]
    if ran_frozen:
        assert "result discarded" in log, log


def losses(query: Query, runs_path: Path, acked: dict[int, str]) -> dict[str, int]:
    """What a promotion lost, counted, not asserted (asynchronous replication).

    ``enqueues``: enqueues whose commit the producer saw, absent from the new
    primary. ``rows``: rows a task body inserted and saw commit, absent.
    ``reruns``: runs beyond the first of one task.
    """
    tasks = {row[0] for row in query("SELECT id::text FROM django_rdbtasks_task", ())}
    effects = set(query(f"SELECT key, worker_id FROM {SideEffect._meta.db_table}", ()))
    acked_path = Path(f"{runs_path}.acked")
    acked_rows = (
        [tuple(line.split(" ")) for line in acked_path.read_text().splitlines()]
        if acked_path.exists()
        else []
    )
    runs = runs_in(runs_path)
    per_task = Counter(run.task_id for run in runs)
    return {
        "acknowledged enqueues": len(acked),
        "enqueues lost": sum(1 for task_id in acked.values() if task_id not in tasks),
        "acknowledged rows": len(acked_rows),
        "rows lost": sum(1 for row in acked_rows if row not in effects),
        "runs": len(runs),
        "reruns": sum(count - 1 for count in per_task.values()),
    }


def audit_ticks(query: Query, runs_path: Path, promoted_at: Any) -> str:
    """The cron job fired each tick once, across the failover, and each tick's task ran."""
    records = query(
        "SELECT key, task_id::text FROM django_rdbtasks_jobrecord WHERE job_name = %s",
        (TICK_JOB,),
    )
    tasks = query(
        "SELECT id::text, status, enqueued_at FROM django_rdbtasks_task WHERE job_name = %s",
        (TICK_JOB,),
    )
    ran = Counter(Path(f"{runs_path}.ticks").read_text().split())
    # One record per tick (unique), one task per record, none without a record.
    assert len({key for key, _ in records}) == len(records)
    assert sorted(task_id for _, task_id in records) == sorted(row[0] for row in tasks)
    assert {row[1] for row in tasks} == {TaskStatus.SUCCESSFUL}, query(
        "SELECT id::text, status, attempts, history::text FROM django_rdbtasks_task "
        "WHERE job_name = %s AND status <> %s",
        (TICK_JOB, TaskStatus.SUCCESSFUL),
    )
    # Each ran; a tick's task ran twice only if it was in flight at the failover.
    assert set(ran) == {row[0] for row in tasks}, (ran, tasks)
    assert any(row[2] >= promoted_at for row in tasks), "no tick fired after the promotion"
    twice = sum(1 for count in ran.values() if count > 1)
    return f"{len(records)} ticks fired once each, {twice} run twice"
