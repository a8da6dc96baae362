"""Patroni fails over by itself: the HA stack people deploy, under load.

One cluster for the module (``scripts/clusters/patroni.py``): etcd, three
PostgreSQL 15 members under Patroni (synchronous mode on), HAProxy in front
(``deploy/patroni/``). Each test migrates a database of its own, then:

- the leader's PostgreSQL is SIGKILLed under load (a producer enqueueing, two
  worker processes draining, the scheduler firing a tick every 2 s); Patroni
  promotes the synchronous standby, the old leader comes back as a replica.
  Once through HAProxy's read-write address, once through libpq's multi-host
  form. The audit is ``tests/failover_audit.py``'s, as for a manual failover;
  the stall is measured and printed;
- ``patronictl switchover`` mid-drain: every task succeeds, the audit holds;
- the leader freezes whole (SIGSTOP: connections to it are half-open, and
  HAProxy answers the clients' keepalives itself): each kind of connection
  (a task's own, the LISTEN one, the worker's claims and renewals) notices,
  reconnects, and LISTEN works again (a task enqueued afterwards starts
  although the worker polls once an hour);
- synchronous mode off (``PATCH /config``): the same kill, and what the
  promotion lost is counted and printed, not asserted.

Run with ``make test-clusters``; docs/failover.md quotes what it measured.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_rdbtasks.states import AttemptOutcome, TaskStatus
from scripts.clusters import patroni
from tests.conftest import ROOT, wait_until, worker_children
from tests.failover_audit import (
    TICK_JOB,
    Producer,
    audit,
    audit_ticks,
    lines,
    losses,
    runs_in,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SETTINGS = "tests.settings_patroni"
#: Enqueued before the workers start; the producer goes on, paced, after that.
INITIAL = 600
LEASE = 4
#: The leader is killed once this many runs are in the file.
KILL_AFTER_RUNS = 200
#: Enqueues acknowledged on the new leader before the producer stops.
AFTER = 150


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[patroni.Cluster]:
    # Under /tmp, not tmp_path: the server user must be able to reach it.
    root = Path(tempfile.mkdtemp(prefix="rdbtasks-patroni-"))
    try:
        try:
            started = patroni.start(root)
        except (patroni.PatroniError, subprocess.SubprocessError) as exc:
            pytest.fail(f"could not start the Patroni cluster: {exc}")
        yield started
    finally:
        keep = tmp_path_factory.mktemp("patroni-logs")
        for log in root.glob("*.log"):  # kept for a failure's post-mortem
            shutil.copy(log, keep / log.name)
        patroni.stop(root)


class Database:
    """A database of one test on the cluster, migrated, reached through ``url``."""

    def __init__(self, cluster: patroni.Cluster, name: str, *, multi_host: bool = False) -> None:
        self.cluster = cluster
        self.name = name
        self.url = cluster.multi_host_url(name) if multi_host else cluster.url(name)
        patroni.wait_healthy(cluster)
        self.query(f"DROP DATABASE IF EXISTS {name}", dbname="postgres")
        self.query(f"CREATE DATABASE {name}", dbname="postgres")
        proc = subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v0"],
            env={**os.environ, "PYTHONPATH": str(ROOT), **self.env()},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stderr

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {
            "DJANGO_SETTINGS_MODULE": SETTINGS,
            "RDBTASKS_PATRONI_URL": self.url,
            **(extra or {}),
        }

    def query(self, sql: str, params: tuple = (), dbname: str | None = None) -> list[tuple]:
        """On the primary, through HAProxy."""
        import psycopg

        url = self.cluster.url(dbname or self.name)
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def answers(self, sql: str, params: tuple = ()) -> list[tuple] | None:
        """``query``, or None while there is no primary to answer."""
        import psycopg

        try:
            return self.query(sql, params)
        except psycopg.OperationalError:
            return None

    def drained(self) -> bool:
        return (
            self.answers(
                "SELECT 1 FROM django_rdbtasks_task WHERE status NOT IN (%s, %s, %s) LIMIT 1",
                tuple(TaskStatus.finished()),
            )
            == []
        )

    def listening(self) -> int:
        rows = self.answers(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND query LIKE %s",
            (self.name, "LISTEN rdbtasks%"),  # the enqueue channel, then the slots one
        )
        return rows[0][0] if rows else 0


@pytest.fixture
def producer(tmp_path: Path) -> Iterator[Callable[[Database], Producer]]:
    made: list[Producer] = []

    def start(database: Database) -> Producer:
        made.append(Producer(tmp_path, database.env(), initial=INITIAL))
        return made[-1]

    yield start
    for each in made:
        each.stop()


class Progress(threading.Thread):
    """Samples the acknowledged enqueues and the runs every 20 ms: the stall is read off it."""

    def __init__(self, source: Producer, runs_path: Path) -> None:
        super().__init__(daemon=True)
        self.source = source
        self.runs_path = runs_path
        self.samples: list[tuple[float, int, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            acked = self.source.log_path.read_text().count("ok ")
            self.samples.append((time.monotonic(), acked, lines(self.runs_path)))
            time.sleep(0.02)

    def stall(self, since: float) -> tuple[float, float]:
        """The longest spells after ``since`` with no new enqueue and with no new run."""
        self.done.set()
        self.join(5)
        result = []
        for column in (1, 2):
            last_time, last_value, longest = since, None, 0.0
            for sample in self.samples:
                if sample[0] < since:
                    last_value = sample[column]
                    continue
                if sample[column] != last_value:
                    longest = max(longest, sample[0] - last_time)
                    last_time, last_value = sample[0], sample[column]
            result.append(longest)
        return result[0], result[1]


def _workers(run_workers, database: Database, runs_path: Path, *more: str):  # type: ignore[no-untyped-def]
    return run_workers(
        "--processes", "2", "--threads", "2", "--lease", str(LEASE),
        "--poll-interval", "0.5", "--log-level", "WARNING", *more,
        env=database.env({"RDBTASKS_FAILOVER_LOG": str(runs_path)}),
    )  # fmt: skip


def _kill_under_load(
    cluster: patroni.Cluster,
    database: Database,
    producer: Callable[[Database], Producer],
    run_workers: Any,
    tmp_path: Path,
) -> dict[str, Any]:
    """Kill the leader's PostgreSQL mid-drain; Patroni promotes; the old leader rejoins."""
    runs_path = tmp_path / "runs.log"
    runs_path.touch()
    source = producer(database)
    wait_until(lambda: len(source.outcomes()[0]) >= INITIAL, timeout=120)
    workers = _workers(run_workers, database, runs_path)
    wait_until(lambda: lines(runs_path) >= KILL_AFTER_RUNS, timeout=120)
    pids_before = set(worker_children(workers.pid))
    progress = Progress(source, runs_path)
    progress.start()
    time.sleep(0.2)

    killed_at = time.monotonic()
    old = patroni.kill_leader(cluster)
    new = wait_until(lambda: _other_leader(cluster, old), timeout=60, interval=0.05)
    promoted_after = time.monotonic() - killed_at
    promoted_at = _now(database)
    acked_at_promotion = len(source.outcomes()[0])
    wait_until(lambda: len(source.outcomes()[0]) >= acked_at_promotion + AFTER, timeout=120)
    write_stall, run_stall = progress.stall(killed_at)
    # The old leader comes back by itself, as a replica of the new one.
    patroni.wait_healthy(cluster, timeout=120)
    states = {s["name"]: s for s in cluster.members_state()}
    assert states[old]["role"] != "leader" and states[new]["role"] == "leader", states
    source.finish()
    wait_until(database.drained, timeout=180, interval=0.5)
    return {
        "workers": workers,
        "pids_before": pids_before,
        "runs_path": runs_path,
        "source": source,
        "promoted_at": promoted_at,
        "old": old,
        "new": new,
        "figures": (
            f"promoted {promoted_after:.1f}s after the kill, longest spell without an "
            f"acknowledged enqueue {write_stall:.1f}s, without a task run {run_stall:.1f}s"
        ),
    }


def _now(database: Database) -> Any:
    """The new primary's clock, once HAProxy routes to it."""
    return wait_until(lambda: database.answers("SELECT now()"), timeout=60)[0][0]


def _other_leader(cluster: patroni.Cluster, old: str) -> str | None:
    try:
        leader = cluster.leader()
    except patroni.PatroniError:
        return None
    return leader if leader not in (None, old) else None


def _ticks(database: Database, runs_path: Path, promoted_at: Any) -> str:
    """The tick audit, once a tick fired on the new leader has run."""
    wait_until(
        lambda: database.answers(
            "SELECT 1 FROM django_rdbtasks_task WHERE job_name = %s AND enqueued_at >= %s "
            "AND status = %s",
            (TICK_JOB, promoted_at, TaskStatus.SUCCESSFUL),
        ),
        timeout=30,
    )
    wait_until(database.drained, timeout=60, interval=0.5)
    return audit_ticks(database.query, runs_path, promoted_at)


def _workers_recovered(database: Database, outcome: dict[str, Any]) -> None:
    """No worker process replaced; both listen on the new leader; they stop cleanly."""
    workers = outcome["workers"]
    assert set(worker_children(workers.pid)) == outcome["pids_before"], workers.log()
    wait_until(lambda: database.listening() == 2, timeout=30)
    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=60) == 0, workers.log()


@pytest.mark.parametrize("address", ["haproxy", "multi-host"])
def test_patroni_fails_over_by_itself_under_load(cluster, producer, run_workers, tmp_path, address):
    """Nothing acknowledged is lost, runs beyond the first are casualties, no stale
    write lands, no worker is replaced, every tick fires once."""
    database = Database(cluster, f"t_patroni_kill_{address.replace('-', '_')}",
                        multi_host=address == "multi-host")  # fmt: skip
    outcome = _kill_under_load(cluster, database, producer, run_workers, tmp_path)
    acked, failed = outcome["source"].outcomes()
    report = audit(database.query, runs_in(outcome["runs_path"]), acked, failed,
                   outcome["promoted_at"])  # fmt: skip
    ticks = _ticks(database, outcome["runs_path"], outcome["promoted_at"])
    _workers_recovered(database, outcome)
    print(
        f"\npatroni failover through {address} ({outcome['old']} -> {outcome['new']}): "
        f"{outcome['figures']}; {report}; {ticks}"
    )


def test_a_switchover_mid_drain_fails_no_task(cluster, producer, run_workers, tmp_path):
    database = Database(cluster, "t_patroni_switchover")
    runs_path = tmp_path / "runs.log"
    runs_path.touch()
    source = producer(database)
    wait_until(lambda: len(source.outcomes()[0]) >= INITIAL, timeout=120)
    workers = _workers(run_workers, database, runs_path)
    wait_until(lambda: lines(runs_path) >= KILL_AFTER_RUNS, timeout=120)
    pids_before = set(worker_children(workers.pid))
    progress = Progress(source, runs_path)
    progress.start()
    started = time.monotonic()
    old = cluster.leader()
    new = patroni.switchover(cluster)
    switched_after = time.monotonic() - started
    promoted_at = _now(database)
    acked_at = len(source.outcomes()[0])
    wait_until(lambda: len(source.outcomes()[0]) >= acked_at + AFTER, timeout=120)
    write_stall, run_stall = progress.stall(started)
    patroni.wait_healthy(cluster, timeout=120)
    source.finish()
    wait_until(database.drained, timeout=180, interval=0.5)
    acked, failed = source.outcomes()
    # Every task SUCCESSFUL, each history possible: none failed for the switchover.
    report = audit(database.query, runs_in(runs_path), acked, failed, promoted_at)
    ticks = _ticks(database, runs_path, promoted_at)
    _workers_recovered(database, {"workers": workers, "pids_before": pids_before})
    print(
        f"\npatroni switchover ({old} -> {new}) in {switched_after:.1f}s: longest spell "
        f"without an acknowledged enqueue {write_stall:.1f}s, without a run {run_stall:.1f}s; "
        f"{report}; {ticks}"
    )


def test_half_open_connections_through_haproxy_are_noticed(cluster, run_workers, tmp_path):
    """The leader freezes whole: every connection through HAProxy to it is half-open.

    HAProxy marks the member down (its REST API does not answer) and closes
    every session to it (``on-marked-down shutdown-sessions``); Patroni
    promotes another member once the frozen leader's key expires. The
    worker polls once an hour: only LISTEN can start the last task in time.
    """
    database = Database(cluster, "t_patroni_half_open")
    runs_path = tmp_path / "runs.log"
    runs_path.touch()
    stop_path = tmp_path / "hold.stop"
    workers = run_workers(
        "--processes", "1", "--threads", "2", "--lease", str(LEASE),
        "--poll-interval", "3600", "--no-scheduler", "--log-level", "WARNING",
        env=database.env({"RDBTASKS_FAILOVER_LOG": str(runs_path)}),
    )  # fmt: skip
    (child,) = wait_until(lambda: worker_children(workers.pid), timeout=30)
    wait_until(lambda: database.listening() == 1, timeout=60)
    held = _enqueue(database, "failover_hold", [str(stop_path)])
    wait_until(lambda: Path(f"{stop_path}.started").exists(), timeout=30)

    old = cluster.leader()
    assert old is not None
    frozen_at = time.time()
    patroni.freeze(cluster, old)
    try:
        new = wait_until(lambda: _other_leader(cluster, old), timeout=60, interval=0.05)
        promoted = time.time() - frozen_at
        # The task's own connection: its query failed, the attempt is retried.
        noticed = wait_until(lambda: _read(Path(f"{stop_path}.noticed")), timeout=60)
        task_noticed = float(noticed.split()[1]) - frozen_at
        # The LISTEN connection is back, on the new leader.
        wait_until(lambda: database.listening() == 1, timeout=60)
        listen_back = time.time() - frozen_at
        # The worker's claims and renewals: the retried attempt is claimed and
        # runs on the new leader; its heartbeat moves there.
        wait_until(lambda: _read(Path(f"{stop_path}.started")).count("\n") >= 2, timeout=60)
        claimed_again = time.time() - frozen_at
        promoted_at = _now(database)
        wait_until(
            lambda: database.answers(
                "SELECT 1 FROM django_rdbtasks_worker WHERE pid = %s AND last_heartbeat_at > %s",
                (child, promoted_at),
            ),
            timeout=LEASE + 10,
        )
        stop_path.touch()
        wait_until(lambda: _status(database, held) == TaskStatus.SUCCESSFUL, timeout=60)
    finally:
        # A machine that froze is reset, not resumed: a Patroni resumed past
        # its leader key's expiry may act on what it saw before the pause.
        # Back, it rejoins as a replica (pg_rewind).
        patroni.stop_member(cluster, old)
        patroni.start_member(cluster, old)
    rows = database.query("SELECT history FROM django_rdbtasks_task WHERE id = %s", (held,))
    first = rows[0][0][0]
    history = rows[0][0]
    assert first["outcome"] in (AttemptOutcome.LOST, AttemptOutcome.RETRY), history

    # LISTEN works again: the worker polls once an hour, its lanes are idle.
    time.sleep(1)
    probe = _enqueue(database, "failover_hold", [str(stop_path)])
    wait_until(lambda: _status(database, probe) == TaskStatus.SUCCESSFUL, timeout=30)
    assert worker_children(workers.pid) == [child], workers.log()

    patroni.wait_healthy(cluster, timeout=120)
    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=60) == 0, workers.log()
    print(
        f"\nhalf-open through HAProxy ({old} frozen, {new} promoted after {promoted:.1f}s): "
        f"a task's own connection failed after {task_noticed:.1f}s, LISTEN back after "
        f"{listen_back:.1f}s, the task claimed again after {claimed_again:.1f}s"
    )


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _enqueue(database: Database, name: str, args: list[Any]) -> str:
    """Enqueue from a process with the cluster's settings; the task's id."""
    code = (
        "import django; django.setup(); from tests import failover_audit; "
        f"print(failover_audit.{name}.enqueue(*{args!r}).id)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT), **database.env()},
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return proc.stdout.strip()


def _status(database: Database, task_id: str) -> str | None:
    rows = database.answers("SELECT status FROM django_rdbtasks_task WHERE id = %s", (task_id,))
    return rows[0][0] if rows else None


def _set_synchronous_mode(cluster: patroni.Cluster, on: bool) -> None:
    leader = cluster.member(cluster.leader() or "m1")
    request = urllib.request.Request(
        f"http://127.0.0.1:{leader.rest_port}/config",
        data=json.dumps({"synchronous_mode": on}).encode(),
        method="PATCH",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10):
        pass

    def applied() -> bool:
        roles = {s.get("role") for s in cluster.members_state()}
        return ("sync_standby" in roles) == on

    wait_until(applied, timeout=60)


def test_asynchronous_replication_loss_is_counted(cluster, producer, run_workers, tmp_path):
    """Synchronous mode off: what the promotion lost is counted, not asserted.

    Whether anything is lost depends on the replication lag at the instant of
    the kill; the counts are printed (docs/failover.md quotes them).
    """
    _set_synchronous_mode(cluster, False)
    try:
        database = Database(cluster, "t_patroni_async")
        outcome = _kill_under_load(cluster, database, producer, run_workers, tmp_path)
        acked, _ = outcome["source"].outcomes()
        counted = losses(database.query, outcome["runs_path"], acked)
        # What is counted was there to lose: acknowledged enqueues and rows,
        # some of them acknowledged by the old leader.
        assert counted["acknowledged enqueues"] > INITIAL + AFTER
        assert counted["acknowledged rows"] >= KILL_AFTER_RUNS
        # Every enqueue the new leader has ran to the end; a lost one never runs.
        rows = database.query(
            "SELECT count(*) FROM django_rdbtasks_task WHERE job_name = '' AND status = %s",
            (TaskStatus.SUCCESSFUL,),
        )
        assert rows[0][0] >= counted["acknowledged enqueues"] - counted["enqueues lost"]
        _workers_recovered(database, outcome)
    finally:
        _set_synchronous_mode(cluster, True)
    print(
        f"\nasynchronous failover ({outcome['old']} -> {outcome['new']}): "
        f"{outcome['figures']}; lost: "
        + ", ".join(f"{key} {value}" for key, value in counted.items())
    )
