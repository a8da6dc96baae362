"""PostgreSQL failover mid-drain: a primary with a synchronous standby, the primary killed.

The pair comes from ``scripts/clusters/pg_pair.py`` (ports 25432 and 25433).
A producer process enqueues one task per committed transaction, before and
through the failover; workers (2 processes x 2 threads, 4 s leases) drain them.
Everybody connects with libpq's multi-host form (``host=a,b``,
``target_session_attrs=read-write``, ``tests/settings_failover.py``). Mid-drain
the primary is SIGKILLed with all its backends and the standby promoted.

What is counted is what the task bodies did, not statuses: each run appends
one line (task id, attempt, pid, worker id) to a file with ``O_APPEND``,
outside the database's fate, then inserts a row in the database. The audit
(``_audit``) checks, on the new primary:

- every enqueue the producer saw commit is there, once, and SUCCESSFUL;
- every task ran at least once (the file), and the run that succeeded left its
  database row (an acknowledged commit survived the failover: synchronous
  replication);
- each task's history is possible: attempts in order, one SUCCESSFUL entry,
  last, written by the last claim (fencing), a version that adds up;
- every run in the file is an entry of the history (none unaccounted for),
  and every run but the last is a failover casualty: LOST or retried after a
  database error, by a claim made before the promotion.

Duplicates (runs beyond the first) are counted and printed.
Run with ``make test-clusters``; docs/failover.md explains what is shown.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from django_rdbtasks.compat import HAS_DJANGO_TASKS
from django_rdbtasks.states import AttemptOutcome, TaskStatus
from scripts.clusters import pg_pair
from tests.conftest import ROOT, wait_until, worker_children
from tests.testapp.models import SideEffect

if HAS_DJANGO_TASKS:
    from django.tasks import task
else:
    from django_tasks import task

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DB_NAME = "rdbtasks_failover"
SETTINGS = "tests.settings_failover"
#: Enqueued before the workers start; the producer then goes on, paced, until stopped.
INITIAL = 1500
PACE = 0.004
BODY_SECONDS = 0.01
LEASE = 4
#: The primary is killed once this many runs are in the file: some, not most.
KILL_AFTER_RUNS = 500
#: Between the kill and the promotion: a failover script is not instantaneous.
OUTAGE = 2.0


@task(takes_context=True, max_attempts=8, backoff=0)
def failover_step(context: Any, n: int) -> int:
    """One run: a line in the file (outside the database), then a row in it."""
    result = context.task_result
    worker_id = result.worker_ids[-1]
    line = f"{result.id} {context.attempt} {os.getpid()} {worker_id}\n"
    fd = os.open(os.environ["RDBTASKS_FAILOVER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    SideEffect.objects.create(key=str(result.id), pid=os.getpid(), worker_id=worker_id)
    time.sleep(BODY_SECONDS)
    return n


def produce(log_path: str, stop_path: str) -> None:
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
            if n >= INITIAL:
                time.sleep(PACE)


# -- the pair and the processes around it -------------------------------------------------


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[pg_pair.Pair]:
    # Under /tmp, not tmp_path: the server user must be able to reach it.
    root = Path(tempfile.mkdtemp(prefix="rdbtasks-pair-"))
    try:
        try:
            started = pg_pair.start(root)
        except (pg_pair.PairError, subprocess.SubprocessError) as exc:
            pytest.fail(f"could not start the PostgreSQL pair: {exc}")
        pg_pair.psql(started.primary_port, f"CREATE DATABASE {DB_NAME}")
        yield started
    finally:
        for log in root.glob("*.log"):  # kept for a failure's post-mortem
            shutil.copy(log, tmp_path / log.name)
        pg_pair.stop(root)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "RDBTASKS_FAILOVER_DB": DB_NAME,
        **(extra or {}),
    }


def _migrate() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **_env()}
    proc = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v0"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def producer(tmp_path: Path) -> Iterator[Callable[[], Producer]]:
    made: list[Producer] = []

    def start() -> Producer:
        made.append(Producer(tmp_path))
        return made[-1]

    yield start
    for each in made:
        each.stop()


class Producer:
    def __init__(self, directory: Path) -> None:
        self.log_path = directory / "producer.log"
        self.stop_path = directory / "producer.stop"
        self.log_path.touch()
        code = (
            "import django; django.setup(); from tests.test_failover import produce; "
            f"produce({str(self.log_path)!r}, {str(self.stop_path)!r})"
        )
        self._err = open(directory / "producer.stderr", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONPATH": str(ROOT), **_env()},
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


def _runs(path: Path) -> list[Run]:
    runs = []
    for position, line in enumerate(path.read_text().splitlines()):
        task_id, attempt, pid, worker_id = line.split(" ")
        runs.append(Run(task_id, int(attempt), int(pid), worker_id, position))
    return runs


def _lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def _query(pair: pg_pair.Pair, sql: str, params: tuple = ()) -> list[tuple]:
    import psycopg

    with psycopg.connect(pair.conninfo(DB_NAME), autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


# -- the test ---------------------------------------------------------------------------


@pytest.mark.parametrize("frozen", [False, True], ids=["failover", "failover-with-a-frozen-worker"])
def test_failover_to_the_synchronous_standby_mid_drain(
    pair, producer, run_workers, tmp_path, frozen
):
    """Kill the primary mid-drain and promote the standby: nothing committed is lost,
    runs beyond the first are all failover casualties, no stale write lands.

    With ``frozen``, one worker process is SIGSTOPped before the kill and
    resumed once its tasks were taken over and finished on the new primary:
    whatever it then writes about them must match nothing.
    """
    _migrate()
    runs_path = tmp_path / "runs.log"
    runs_path.touch()
    source = producer()
    wait_until(lambda: len(source.outcomes()[0]) >= INITIAL, timeout=120)
    workers = run_workers(
        "--processes", "2", "--threads", "2", "--lease", str(LEASE),
        "--poll-interval", "0.5", "--log-level", "WARNING",
        env=_env({"RDBTASKS_FAILOVER_LOG": str(runs_path)}),
    )  # fmt: skip
    wait_until(lambda: _lines(runs_path) >= KILL_AFTER_RUNS, timeout=120)

    frozen_pid, frozen_held = None, set()
    if frozen:
        frozen_pid, frozen_held = _freeze_a_busy_worker(pair, workers.pid, runs_path)
    pids_before = set(worker_children(workers.pid))
    runs_at_kill = _lines(runs_path)
    acked_at_kill = len(source.outcomes()[0])
    pg_pair.kill_primary(pair.root)
    time.sleep(OUTAGE)
    pg_pair.promote(pair.root)
    promoted_at = _query(pair, "SELECT now()")[0][0]
    position_at_promotion = _lines(runs_path)
    acked_at_promotion = len(source.outcomes()[0])
    # The producer goes on against the new primary for a while.
    wait_until(lambda: len(source.outcomes()[0]) >= acked_at_promotion + 200, timeout=120)
    source.finish()
    acked, failed = source.outcomes()
    assert acked_at_kill < len(acked)

    if frozen:
        # Its tasks are taken over once their leases run out, and finished.
        def taken_over_and_done() -> bool:
            return not _query(
                pair,
                "SELECT 1 FROM django_rdbtasks_task WHERE id = ANY(%s::uuid[]) AND status <> %s",
                (list(frozen_held), TaskStatus.SUCCESSFUL),
            )

        wait_until(taken_over_and_done, timeout=120)
        assert frozen_pid is not None
        os.kill(frozen_pid, signal.SIGCONT)

    def drained() -> bool:
        return not _query(
            pair,
            "SELECT 1 FROM django_rdbtasks_task WHERE status NOT IN (%s, %s, %s) LIMIT 1",
            tuple(TaskStatus.finished()),
        )

    wait_until(drained, timeout=180, interval=0.5)

    # Every process recovered by itself: none was replaced, each ran tasks
    # again after the promotion, and each listens again on the new primary.
    assert set(worker_children(workers.pid)) == pids_before, workers.log()
    runs = _runs(runs_path)
    ran_after = {run.pid for run in runs[position_at_promotion:]}
    busy_before = {run.pid for run in runs[:runs_at_kill]} - {frozen_pid}
    assert busy_before <= ran_after, (busy_before, ran_after)

    def listening() -> bool:
        sql = "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN rdbtasks'"
        return _query(pair, sql)[0][0] == 2

    wait_until(listening, timeout=30)

    report = _audit(pair, runs, acked, failed, promoted_at)
    if frozen:
        _audit_frozen(pair, runs, frozen_pid, frozen_held, workers.log())
    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=60) == 0, workers.log()
    assert "database error" in workers.log()
    print(
        f"\nfailover{' with a frozen worker' if frozen else ''}: {report}, "
        f"runs before the kill {runs_at_kill}, acked before the kill {acked_at_kill}"
    )


def test_an_idle_worker_comes_back_whole_after_a_failover(pair, producer, run_workers, tmp_path):
    """Nothing to run across the failover: every part must reconnect by itself.

    The claim loop, the listener and the lease keeper's heartbeat (what the
    admin and ``rdbtasks probe live`` read) are back on the new primary with no
    task to push them; then new tasks run.
    """
    _migrate()
    runs_path = tmp_path / "runs.log"
    runs_path.touch()
    workers = run_workers(
        "--processes", "1", "--threads", "2", "--lease", str(LEASE),
        "--poll-interval", "0.5", "--log-level", "WARNING",
        env=_env({"RDBTASKS_FAILOVER_LOG": str(runs_path)}),
    )  # fmt: skip
    (child,) = wait_until(lambda: _worker_pids(pair), timeout=60)
    children = set(worker_children(workers.pid))  # the worker and the scheduler

    def listening() -> bool:
        sql = "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN rdbtasks'"
        return _query(pair, sql)[0][0] == 1

    wait_until(listening, timeout=60)
    pg_pair.kill_primary(pair.root)
    time.sleep(OUTAGE)
    pg_pair.promote(pair.root)
    promoted_at = _query(pair, "SELECT now()")[0][0]

    wait_until(listening, timeout=60)
    # Its heartbeat while it is idle: one every third of a lease (asserted last).
    deadline = time.monotonic() + LEASE + 2
    while time.monotonic() < deadline:
        beats = _query(
            pair,
            "SELECT 1 FROM django_rdbtasks_worker WHERE pid = %s AND last_heartbeat_at > %s",
            (child, promoted_at),
        )
        if beats:
            break
        time.sleep(0.2)
    source = producer()
    wait_until(lambda: len(source.outcomes()[0]) >= 50, timeout=60)
    source.finish()
    acked, _ = source.outcomes()
    wait_until(
        lambda: (
            _query(
                pair,
                "SELECT count(*) FROM django_rdbtasks_task WHERE status = %s",
                (TaskStatus.SUCCESSFUL,),
            )[0][0]
            == len(acked)
        ),
        timeout=60,
    )
    assert {run.pid for run in _runs(runs_path)} == {child}
    assert set(worker_children(workers.pid)) == children  # recovered, not replaced
    assert beats, "the worker's heartbeat did not come back after the failover"


def _worker_pids(pair: pg_pair.Pair) -> list[int]:
    return [row[0] for row in _query(pair, "SELECT pid FROM django_rdbtasks_worker")]


def _freeze_a_busy_worker(
    pair: pg_pair.Pair, supervisor: int, runs_path: Path
) -> tuple[int, set[str]]:
    """SIGSTOP a worker process that holds claims; return it and the tasks it holds."""
    ran = {run.pid for run in _runs(runs_path)}
    candidates = [pid for pid in worker_children(supervisor) if pid in ran]
    assert candidates, "no worker process has run anything yet"
    pid = candidates[0]

    def held() -> list[tuple]:
        return _query(
            pair,
            "SELECT id::text FROM django_rdbtasks_task WHERE status = %s AND worker_id LIKE %s",
            (TaskStatus.RUNNING, f"%:{pid}:%"),
        )

    wait_until(held, timeout=60, interval=0.01)
    os.kill(pid, signal.SIGSTOP)
    # A statement it sent just before stopping still completes on the server:
    # read once that is over. Then nothing it holds changes until its leases
    # run out.
    time.sleep(0.5)
    rows = held()
    assert rows, "the frozen worker held nothing"
    return pid, {row[0] for row in rows}


DATABASE_ERRORS = ("OperationalError", "InterfaceError", "DatabaseError")


def _audit(
    pair: pg_pair.Pair,
    runs: list[Run],
    acked: dict[int, str],
    failed: set[int],
    promoted_at: Any,
) -> str:
    rows = _query(
        pair,
        "SELECT id::text, status, attempts, version, worker_id, history, args "
        "FROM django_rdbtasks_task",
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
        for key, worker_id in _query(
            pair, f"SELECT key, worker_id FROM {SideEffect._meta.db_table}"
        )
    }
    duplicated: dict[str, int] = {}
    stale: list[str] = []
    for task_id, (_, _, attempts, version, worker_id, history, _) in tasks.items():
        if isinstance(history, str):
            history = json.loads(history)
        claims = [(run.attempt, run.worker_id) for run in runs_of[task_id]]
        try:
            stale += _check_history(task_id, attempts, version, worker_id, history, promoted_at)
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
    # Every run but the last was in flight at the failover: a slot whose claim
    # connection failed also dropped its task connections, so no task spends
    # an attempt finding the dead primary.
    assert not stale, Counter(stale)
    return (
        f"{len(rows)} tasks ({len(acked)} acknowledged, {landed} of {len(failed)} "
        f"failed enqueues landed), {len(runs)} runs, {sum(duplicated.values())} duplicate "
        f"runs over {len(duplicated)} tasks, {len(stale)} attempts failed on a stale "
        f"task connection"
    )


def _check_history(
    task_id: str, attempts: int, version: int, worker_id: str, history: list, promoted_at: Any
) -> list[str]:
    """One possible history: the last claim succeeded, every earlier one is a casualty.

    Returns the slots whose attempt, claimed on the new primary, failed on a
    database error: a task connection the slot opened to the dead primary.
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
            stale.append(entry["worker_id"])
        lost += entry["outcome"] == AttemptOutcome.LOST
    # Each claim adds one to the version and each outcome written one more; a
    # lost claim has no outcome, a released one gives its attempt back. A lost
    # attempt whose entry is missing (below) is a lost claim too.
    lost += attempts - len(history)
    assert (version + lost) % 2 == 0 and version >= 2 * attempts - lost, (task_id, version)
    return stale


def _audit_frozen(
    pair: pg_pair.Pair, runs: list[Run], pid: int | None, held: set[str], log: str
) -> None:
    """The frozen process's claims were taken over; what it wrote on resuming matched nothing."""
    rows = _query(
        pair,
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
