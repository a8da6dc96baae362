"""PostgreSQL failover mid-drain: a primary with a synchronous standby, the primary killed.

The pair comes from ``scripts/clusters/pg_pair.py`` (ports 25432 and 25433).
A producer process enqueues one task per committed transaction, before and
through the failover; workers (2 processes x 2 threads, 4 s leases) drain them.
Everybody connects with libpq's multi-host form (``host=a,b``,
``target_session_attrs=read-write``, ``tests/settings_failover.py``). Mid-drain
the primary is SIGKILLed with all its backends and the standby promoted.

What is counted is what the task bodies did, not statuses; the audit is
``tests/failover_audit.py``'s, shared with ``tests/test_patroni.py``.

Duplicates (runs beyond the first) are counted and printed.
Run with ``make test-clusters``; docs/failover.md explains what is shown.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from django_rdbtasks.states import TaskStatus
from scripts.clusters import pg_pair
from tests.conftest import ROOT, wait_until, worker_children
from tests.failover_audit import (
    INITIAL,
    Producer,
    Query,
    audit,
    audit_frozen,
    lines,
    runs_in,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DB_NAME = "rdbtasks_failover"
SETTINGS = "tests.settings_failover"
LEASE = 4
#: The primary is killed once this many runs are in the file: some, not most.
KILL_AFTER_RUNS = 500
#: Between the kill and the promotion: a failover script is not instantaneous.
OUTAGE = 2.0


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
        made.append(Producer(tmp_path, _env()))
        return made[-1]

    yield start
    for each in made:
        each.stop()


def _querier(pair: pg_pair.Pair) -> Query:
    return lambda sql, params=(): _query(pair, sql, params)


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
    wait_until(lambda: lines(runs_path) >= KILL_AFTER_RUNS, timeout=120)

    frozen_pid, frozen_held = None, set()
    if frozen:
        frozen_pid, frozen_held = _freeze_a_busy_worker(pair, workers.pid, runs_path)
    pids_before = set(worker_children(workers.pid))
    runs_at_kill = lines(runs_path)
    acked_at_kill = len(source.outcomes()[0])
    pg_pair.kill_primary(pair.root)
    time.sleep(OUTAGE)
    pg_pair.promote(pair.root)
    promoted_at = _query(pair, "SELECT now()")[0][0]
    position_at_promotion = lines(runs_path)
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
    runs = runs_in(runs_path)
    ran_after = {run.pid for run in runs[position_at_promotion:]}
    busy_before = {run.pid for run in runs[:runs_at_kill]} - {frozen_pid}
    assert busy_before <= ran_after, (busy_before, ran_after)

    def listening() -> bool:
        # The listener's last statement: LISTEN rdbtasks, then LISTEN rdbtasks_slot.
        sql = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s"
        return _query(pair, sql, ("LISTEN rdbtasks%",))[0][0] == 2

    wait_until(listening, timeout=30)

    report = audit(_querier(pair), runs, acked, failed, promoted_at)
    if frozen:
        audit_frozen(_querier(pair), runs, frozen_pid, frozen_held, workers.log())
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
        sql = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s"
        return _query(pair, sql, ("LISTEN rdbtasks%",))[0][0] == 1

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
    assert {run.pid for run in runs_in(runs_path)} == {child}
    assert set(worker_children(workers.pid)) == children  # recovered, not replaced
    assert beats, "the worker's heartbeat did not come back after the failover"


def _worker_pids(pair: pg_pair.Pair) -> list[int]:
    return [row[0] for row in _query(pair, "SELECT pid FROM django_rdbtasks_worker")]


def _freeze_a_busy_worker(
    pair: pg_pair.Pair, supervisor: int, runs_path: Path
) -> tuple[int, set[str]]:
    """SIGSTOP a worker process that holds claims; return it and the tasks it holds."""
    ran = {run.pid for run in runs_in(runs_path)}
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
