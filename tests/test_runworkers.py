"""``manage.py runworkers`` in real processes: races, crashes, signals, outages."""

import os
import signal
import subprocess
import sys
import time

import pytest
from django.db import connection

from django_rdbtasks.backend import bulk_enqueue
from django_rdbtasks.db.functions import DbNow
from django_rdbtasks.models import Task, Worker
from tests.conftest import ROOT, rows_by_table, tables_holding, wait_until, worker_children
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def statuses():
    return {
        status: Task.objects.filter(status=status).count()
        for status in ("READY", "RUNNING", "SUCCESSFUL", "FAILED")
    }


@pytest.mark.parametrize("mode", ["optimistic", "skip-locked"])
def test_racing_processes_run_each_task_exactly_once(run_workers, vendor, mode):
    if vendor == "sqlite":
        if mode == "skip-locked":
            pytest.skip("refused on SQLite; see test_skip_locked_is_refused_on_sqlite")
        # One writer at a time: a smaller race, with bodies slow enough that a
        # single process cannot drain it before the others have started.
        count, processes = 1000, 4
        bulk_enqueue(tasks.record_then_sleep, [((f"race-{i}", 0.002), {}) for i in range(count)])
    else:
        count, processes = 5000, 8
        bulk_enqueue(tasks.record, [((f"race-{i}",), {}) for i in range(count)])
    workers = run_workers(
        "--processes",
        str(processes),
        "--mode",
        mode,
        "--batch",
        "10",
        "--burst",
        "--log-level",
        "WARNING",
    )
    assert workers.wait(timeout=600) == 0, workers.log()
    # Count side effects, not statuses: each task body ran exactly once.
    assert SideEffect.objects.count() == count
    assert SideEffect.objects.values("key").distinct().count() == count
    assert Task.objects.filter(status="SUCCESSFUL", attempts=1).count() == count
    assert SideEffect.objects.values("pid").distinct().count() > 1  # it was a race
    if vendor == "postgresql":  # every row moved once, none left behind or copied
        assert rows_by_table() == {"task": 0, "finished": count}


def test_skip_locked_is_refused_on_sqlite(run_workers, vendor):
    if vendor != "sqlite":
        pytest.skip("SQLite only")
    workers = run_workers("--mode", "skip-locked", "--burst")
    assert workers.wait(timeout=60) != 0
    assert "SQLite" in workers.log() and "skip-locked" in workers.log()


def test_burst_exits_zero_once_drained(run_workers):
    for i in range(30):
        tasks.record.enqueue(f"b{i}")
    workers = run_workers("--processes", "2", "--burst")
    assert workers.wait(timeout=120) == 0, workers.log()
    assert statuses()["SUCCESSFUL"] == 30
    assert "succeeded (ran" in workers.log()  # one INFO line per task


def test_worker_processes_collect_young_objects_less_often(run_workers):
    import gc

    from django_rdbtasks.worker.supervisor import YOUNG_GC_THRESHOLD

    result = tasks.gc_thresholds.enqueue()
    workers = run_workers("--burst")
    assert workers.wait(timeout=120) == 0, workers.log()
    young, *older = Task.objects.get(pk=result.id).return_value
    assert young == YOUNG_GC_THRESHOLD
    assert older == list(gc.get_threshold()[1:])  # the older generations' as they were


def test_sigkilled_worker_task_is_reclaimed_after_its_lease(run_workers):
    result = tasks.slow_first_attempt.enqueue("crash", 60)
    workers = run_workers("--lease", "1", "--poll-interval", "0.2")
    first = wait_until(lambda: SideEffect.objects.filter(key="crash").first(), timeout=60)
    os.kill(first.pid, signal.SIGKILL)  # mid-task: it sleeps for a minute

    # The supervisor starts a new process; it reclaims the task once the lease is over.
    wait_until(lambda: Task.objects.get(pk=result.id).status == "SUCCESSFUL", timeout=60)
    row = Task.objects.get(pk=result.id)
    assert row.attempts == 2
    lost, done = row.history
    assert lost["outcome"] == "LOST" and lost["worker_id"] == first.worker_id
    assert done["outcome"] == "SUCCESSFUL" and done["worker_id"] != first.worker_id
    assert row.return_value["attempt"] == 2 and row.return_value["pid"] != first.pid
    assert SideEffect.objects.filter(key="crash").count() == 2  # one per start
    assert first.pid not in worker_children(workers.pid)  # replaced by the supervisor
    if connection.vendor == "postgresql":
        assert tables_holding(result.id) == ["finished"]
    result.refresh()
    assert [e.exception_class_path for e in result.errors] == [
        "django_rdbtasks.exceptions.WorkerLost"
    ]


def test_stale_worker_that_finishes_after_the_reclaim_writes_nothing(run_workers):
    result = tasks.slow_first_attempt.enqueue("stale", 2)
    stale = run_workers("--lease", "1")
    first = wait_until(lambda: SideEffect.objects.filter(key="stale").first(), timeout=60)
    os.kill(first.pid, signal.SIGSTOP)  # frozen mid-task: no heartbeat, lease runs out
    try:
        fresh = run_workers("--lease", "30", "--poll-interval", "0.2")
        wait_until(lambda: Task.objects.get(pk=result.id).status == "SUCCESSFUL", timeout=60)
        fresh.stop()
        after_reclaim = Task.objects.get(pk=result.id)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    # The stale process wakes, finishes its sleep and tries to write its result.
    wait_until(lambda: "result discarded" in stale.log(), timeout=60)
    row = Task.objects.get(pk=result.id)
    assert (row.status, row.version, row.worker_id, row.return_value, row.history) == (
        after_reclaim.status,
        after_reclaim.version,
        after_reclaim.worker_id,
        after_reclaim.return_value,
        after_reclaim.history,
    )
    assert row.return_value["attempt"] == 2
    if connection.vendor == "postgresql":  # the stale write moved nothing, copied nothing
        assert tables_holding(result.id) == ["finished"]


def test_graceful_shutdown_releases_claims_without_spending_attempts(run_workers):
    for i in range(3):
        tasks.record_then_sleep.enqueue(f"g{i}", 5)
    workers = run_workers("--batch", "3", "--grace", "0.5")
    wait_until(lambda: SideEffect.objects.exists(), timeout=60)
    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=60) == 0, workers.log()
    rows = list(Task.objects.all())
    assert [(r.status, r.attempts, r.worker_id, r.history) for r in rows] == [
        ("READY", 0, "", [])
    ] * 3
    assert "released" in workers.log()


def test_graceful_shutdown_lets_running_tasks_finish_within_grace(run_workers):
    for i in range(3):
        tasks.record_then_sleep.enqueue(f"f{i}", 1)
    workers = run_workers("--batch", "3", "--grace", "30")
    wait_until(lambda: SideEffect.objects.exists(), timeout=60)
    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=60) == 0, workers.log()
    assert statuses() == {"READY": 2, "RUNNING": 0, "SUCCESSFUL": 1, "FAILED": 0}
    assert set(Task.objects.filter(status="READY").values_list("attempts", flat=True)) == {0}


def test_second_signal_exits_at_once(run_workers):
    tasks.record_then_sleep.enqueue("long", 60)
    workers = run_workers("--grace", "60", "--lease", "5")
    wait_until(lambda: SideEffect.objects.exists(), timeout=60)
    workers.signal(signal.SIGTERM)
    time.sleep(0.5)
    workers.signal(signal.SIGTERM)
    workers.wait(timeout=20)
    # The claim is left to its lease: still RUNNING, claimable when it expires.
    assert Task.objects.get().status == "RUNNING"


def _kill_other_connections(vendor):
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        else:
            cursor.execute(
                "SELECT id FROM information_schema.processlist "
                "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
            for (thread_id,) in cursor.fetchall():
                try:
                    cursor.execute(f"KILL CONNECTION {int(thread_id)}")
                except Exception:
                    pass  # already gone


def _finish_after_lost_claims(run_workers):
    """Drain what a claim lost with its connection held: free again once its lease lapses.

    A claim that committed while its answer was lost leaves the task RUNNING
    for nobody until the lease expires; at-least-once means it then runs.
    """
    wait_until(
        lambda: not Task.objects.filter(status="RUNNING", lease_expires_at__gt=DbNow()).exists(),
        timeout=60,
    )
    again = run_workers("--burst", "--poll-interval", "0.2", "--no-scheduler")
    assert again.wait(timeout=120) == 0, again.log()


def test_lost_database_connections_are_survived(run_workers, vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite has no server connection to lose")
    count = 300
    bulk_enqueue(tasks.record_then_sleep, [((f"c{i}", 0.01), {}) for i in range(count)])
    workers = run_workers("--processes", "2", "--poll-interval", "0.2", "--burst", "--lease", "2")
    for _ in range(4):
        wait_until(lambda: SideEffect.objects.count() > 0, timeout=60)
        time.sleep(0.3)
        _kill_other_connections(vendor)
    assert workers.wait(timeout=300) == 0, workers.log()
    assert "database error" in workers.log()
    _finish_after_lost_claims(run_workers)
    assert statuses()["SUCCESSFUL"] == count
    # At least once: every task ran; a run whose result was lost with its
    # connection may run again, never zero times.
    assert SideEffect.objects.values("key").distinct().count() == count


def _kill_writers_beside_claims():
    """The sessions that write outcomes beside a claim (worker/beside.py), told by
    their name (``rdbtasks-beside-<lane>_0 pid <pid>``), killed; how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE %s",
            ["rdbtasks-beside-%"],
        )
        return cursor.fetchone()[0]


def test_results_written_beside_the_claim_survive_their_connection(run_workers, vendor):
    """Short tasks' results go on a second connection while the round claims; that
    connection killed again and again mid-drain, each task still runs once and
    every result is written (by the lane's next round)."""
    if vendor != "postgresql":
        pytest.skip("only PostgreSQL's rounds are one statement, written beside the claim")
    count, drains, killed = 5000, 0, 0
    # A machine too busy to run tasks within 50 ms of each other hands claims
    # back and keeps rounds small, never written beside: another drain then.
    while killed == 0 and drains < 4:
        drains += 1
        bulk_enqueue(tasks.record, [((f"b{drains}-{i}",), {}) for i in range(count)])
        # Claimed 200 at a time: a round writes 50 outcomes or more.
        workers = run_workers("--processes", "1", "--batch", "200", "--burst", "--no-scheduler")
        while workers.process.poll() is None and killed < 6:
            killed += _kill_writers_beside_claims()
            time.sleep(0.01)
        assert workers.wait(timeout=300) == 0, workers.log()
    assert killed > 0  # a drain wrote beside its claims
    assert "beside the claim" in workers.log()
    assert statuses()["SUCCESSFUL"] == count * drains
    # Exactly once: only the writer's sessions were killed, never a claim's.
    assert SideEffect.objects.count() == count * drains
    assert SideEffect.objects.values("key").distinct().count() == count * drains


def test_notify_wakes_an_idle_worker(run_workers, vendor):
    if vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; other databases poll")
    run_workers("--poll-interval", "3600")

    def listening():
        with connection.cursor() as cursor:
            # The listener's last statement: LISTEN rdbtasks, then LISTEN rdbtasks_slot.
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s", ["LISTEN rdbtasks%"]
            )
            return cursor.fetchone()[0]

    wait_until(listening, timeout=60)
    time.sleep(0.5)  # past its first, empty poll: now only a NOTIFY can wake it
    result = tasks.add.enqueue(2, 2)
    # Arrives long before the hour-long poll would; latency figures are in bench/.
    wait_until(lambda: Task.objects.get(pk=result.id).status == "SUCCESSFUL", timeout=30)


@pytest.mark.parametrize(
    "args",
    [("--processes", "1", "--mode", "skip-locked"), ("--burst",)],
    ids=["workers", "burst"],
)
def test_workers_started_while_the_database_is_away_wait_for_it(run_workers, vendor, args):
    if vendor == "sqlite":
        pytest.skip("SQLite is a file: it cannot be away")
    scheme = "postgres" if vendor == "postgresql" else "mysql"
    # Nothing listens on port 1: the system checks (which ask the database on
    # Django 6.1: "system checks skipped"), the Galera probe of skip-locked, the
    # registration and a burst's firing of due jobs all meet a refused
    # connection; none may end the process.
    workers = run_workers(*args, env={"DATABASE_URL": f"{scheme}://root@127.0.0.1:1/test"})
    wait_until(lambda: "database error during" in workers.log(), timeout=60)
    assert workers.process.poll() is None, workers.log()
    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=30) == 0, workers.log()


def _runworkers(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RDBTASKS_TEST_WORKER": "1", "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.run(
        [sys.executable, "-m", "django", "runworkers", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_command_refuses_bad_options():
    for args, message in [
        (["--queue", "missing"], "--queue 'missing' is not in TASKS['default']['QUEUES']"),
        (["--queue", "emials"], "Did you mean 'emails'?"),
        (["--backend", "nope"], "--backend 'nope' is not in TASKS (default)."),
        (["--processes", "-1"], "at least 0"),
        (["--threads", "0"], "at least 1"),
        (["--processes", "0", "--no-scheduler"], "run nothing"),
        # Issue 39: 0 replaced every process before it ran a task, forever.
        (["--max-tasks", "0"], "--max-tasks must be at least 1, not 0."),
        (["--grace", "-1"], "--grace must be at least 0 seconds, not -1.0."),
        (["--lease", "nan"], "--lease must be a positive number of seconds, not nan."),
        (["--log-level", "LOUD"], "argument --log-level: invalid choice: 'LOUD'"),
    ]:
        proc = _runworkers(*args, "--burst")
        assert proc.returncode != 0
        assert message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr


def test_command_names_every_bad_option_at_once_before_doing_anything():
    tasks.noop.enqueue()
    proc = _runworkers(
        "--max-tasks", "0", "--grace", "-1", "--threads", "0", "--queue", "emials", "--burst"
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("CommandError: Refused, nothing was done:"), proc.stderr
    for problem in (
        "--threads must be at least 1, not 0.",
        "--max-tasks must be at least 1, not 0.",
        "--grace must be at least 0 seconds, not -1.0.",
        "--queue 'emials' is not in TASKS['default']['QUEUES'] (default, emails, other). "
        "Did you mean 'emails'?",
    ):
        assert problem in proc.stderr, proc.stderr
    # Nothing started: no worker registered, no task claimed, nothing logged.
    assert not Worker.objects.exists()
    assert Task.objects.get().status == "READY"
    assert proc.stdout == ""


def _restart_database_server(vendor):
    """Stop and start the real server, as an operator or a crash would."""
    if vendor == "postgresql":
        version = sorted(os.listdir("/etc/postgresql"))[-1]
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
            check=True,
            capture_output=True,
            timeout=120,
        )
    else:
        subprocess.run(["mariadb-admin", "-uroot", "shutdown"], check=True, timeout=120)
        time.sleep(1)
        subprocess.run(
            [
                "start-stop-daemon",
                "--start",
                "--oknodo",
                "--background",
                # This server only: any other mariadbd (a Galera test's nodes)
                # would otherwise count as "already running".
                "--pidfile",
                "/run/mysqld/mysqld.pid",
                "--exec",
                "/usr/sbin/mariadbd",
            ],
            check=True,
            timeout=60,
        )
    connection.close()

    def reachable():
        try:
            connection.ensure_connection()
            return True
        except Exception:
            connection.close()
            return False

    wait_until(reachable, timeout=120, interval=0.5)


@pytest.mark.server_restart
def test_database_restart_is_survived(run_workers, vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite has no server to restart")
    if os.geteuid() != 0:
        pytest.skip("restarting the database server needs root")
    count = 200
    bulk_enqueue(tasks.record_then_sleep, [((f"r{i}", 0.02), {}) for i in range(count)])
    workers = run_workers("--processes", "2", "--poll-interval", "0.2", "--burst", "--lease", "2")
    wait_until(lambda: SideEffect.objects.count() > 10, timeout=60)
    _restart_database_server(vendor)
    assert workers.wait(timeout=300) == 0, workers.log()
    assert "database error" in workers.log()
    _finish_after_lost_claims(run_workers)
    assert statuses()["SUCCESSFUL"] == count
    assert SideEffect.objects.values("key").distinct().count() == count


def test_max_tasks_recycles_worker_processes(run_workers):
    for i in range(12):
        tasks.record.enqueue(f"m{i}")
    workers = run_workers("--max-tasks", "5", "--burst")
    assert workers.wait(timeout=120) == 0, workers.log()
    assert SideEffect.objects.count() == 12
    # 5 + 5 + 2: the supervisor replaced the process twice.
    assert SideEffect.objects.values("pid").distinct().count() == 3
    assert workers.log().count("recycled after --max-tasks") == 2


# -- started before migrate -------------------------------------------------------------


class EmptyDatabase:
    """A database of the test server (or an SQLite file) with no table at all."""

    def __init__(self, vendor):
        from django.conf import settings

        self.vendor = vendor
        self.name = f"{os.environ.get('RDBTASKS_TEST_DB', 'test_rdbtasks')}_nomigrate"
        if vendor == "sqlite":
            self.path = os.path.join(os.path.dirname(settings.TEST_DB_NAME), f"{self.name}.sqlite3")
            self.drop()
        else:
            self._execute(f"DROP DATABASE IF EXISTS {self.name}")
            self._execute(f"CREATE DATABASE {self.name}")
        #: What a process started with it uses (tests/settings.py).
        self.env = {"RDBTASKS_TEST_DB": self.name, "RDBTASKS_TEST_WORKER": "1"}

    def _execute(self, sql):
        with connection.cursor() as cursor:
            cursor.execute(sql)

    def run(self, *args, code=None):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
        command = [sys.executable, "-m", "django", *args] + (["-c", code] if code else [])
        done = subprocess.run(
            command, env={**env, **self.env}, cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""

    def drop(self):
        if self.vendor == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(self.path + suffix):
                    os.remove(self.path + suffix)
        elif self.vendor == "postgresql":
            self._execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        else:
            self._execute(f"DROP DATABASE IF EXISTS {self.name}")


def test_workers_started_before_migrate_say_so_and_start_once_it_has_run(run_workers, vendor):
    empty = EmptyDatabase(vendor)
    workers = run_workers("--processes", "2", "--poll-interval", "0.1", env=empty.env)
    try:
        missing = "the task tables are missing: run manage.py migrate"
        wait_until(lambda: missing in workers.log(), timeout=60)
        time.sleep(3)  # a poll every second: still said once, not once per poll or process
        assert workers.log().count(missing) == 1, workers.log()
        # No process was started to retry against the missing tables.
        assert "database error" not in workers.log(), workers.log()
        assert "worker" not in workers.log().replace("worker processes start", ""), workers.log()
        assert workers.process.poll() is None, workers.log()

        empty.run("migrate", "--verbosity", "0")
        wait_until(lambda: "starting the worker processes" in workers.log(), timeout=60)
        # Without a restart: the same supervisor's processes run what is enqueued now.
        task_id = empty.run(
            "shell", code="from tests.testapp.tasks import add; print(add.enqueue(2, 3).id)"
        )
        status = f"from tests.testapp.tasks import add; print(add.get_result({task_id!r}).status)"
        wait_until(lambda: empty.run("shell", code=status) == "SUCCESSFUL", timeout=60)
        workers.signal(signal.SIGTERM)
        assert workers.wait(timeout=60) == 0, workers.log()
    finally:
        workers.stop()
        empty.drop()
