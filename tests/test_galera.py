"""A three-node MariaDB Galera cluster: workers on every node race over the same tasks.

The cluster is started by ``scripts/clusters/galera.py`` on local ports
(23061-23063) under a tmp dir, once for the module, and stopped in teardown
whatever happens. Row locks are local to a node there, so claims made on two
nodes at once both see their UPDATE match a row; Galera certifies the commits
and fails all but the first with error 1213. The worker must take that as a
lost race (retry, no harm done) and never run a task twice or fail one.

Run with ``make test-clusters`` (needs ``galera-4``, ``mariadb-server``,
``rsync``).
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import MySQLdb
import pytest
from django.conf import settings

from django_rdbtasks.retrying import is_lost_race
from django_rdbtasks.states import TaskStatus
from scripts.clusters.galera import ClusterError, GaleraCluster
from tests.test_limits import max_overlap

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
TASKS = 5_000
#: Worker processes per node: 8 in all.
PROCESSES = {1: 3, 2: 3, 3: 2}
THREADS = 2
RACE_LINE = "lost a race during"


@pytest.fixture(scope="module")
def galera() -> Iterator[GaleraCluster]:
    # Not pytest's tmp dir: it is private to root, and the servers run as mysql.
    base = Path(tempfile.mkdtemp(prefix="rdbtasks-galera-"))
    cluster = GaleraCluster(base)
    try:
        try:
            cluster.start()
        except ClusterError as exc:
            pytest.fail(f"could not start the Galera cluster: {exc}")
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def galera_db(galera: GaleraCluster) -> str:
    """The test database on the cluster, migrated through node 1 (DDL replicates)."""
    name = settings.DATABASES["default"]["TEST"]["NAME"]
    galera.query(1, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    manage(galera, name, 1, "migrate", "--no-input", "-v", "0")
    return name


def node_env(galera: GaleraCluster, name: str, node: int) -> dict[str, str]:
    return {
        "DATABASE_URL": galera.url(node, name),
        "DJANGO_SETTINGS_MODULE": "tests.settings_galera",
        "RDBTASKS_TEST_DB": name,
        "RDBTASKS_TEST_WORKER": "1",
    }


def manage(galera: GaleraCluster, name: str, node: int, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "django", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **node_env(galera, name, node)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stdout}{done.stderr}"
    return done.stdout


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def conflicts(galera: GaleraCluster) -> int:
    """Certification failures and brute-force aborts, summed over the nodes."""
    total = 0
    for node in (1, 2, 3):
        status = galera.status(node)
        total += int(status["wsrep_local_cert_failures"]) + int(status["wsrep_local_bf_aborts"])
    return total


def on_every_node(galera: GaleraCluster, name: str, sql: str) -> list[list[list[str]]]:
    """``sql`` on each node, after the node has applied everything committed before."""
    return [
        galera.query(node, f"SET SESSION wsrep_sync_wait = 1; USE `{name}`; {sql}")
        for node in (1, 2, 3)
    ]


def test_eight_workers_on_three_nodes_run_each_of_5000_tasks_exactly_once(
    galera, galera_db, run_workers
):
    manage(
        galera,
        galera_db,
        1,
        "shell",
        "-c",
        "from django_rdbtasks.backend import bulk_enqueue\n"
        "from tests.testapp import tasks\n"
        f"bulk_enqueue(tasks.record, [((f'g{{i}}',), {{}}) for i in range({TASKS})])",
    )
    before = conflicts(galera)
    started = time.monotonic()

    supervisors = [
        run_workers(
            "--processes",
            str(count),
            "--threads",
            str(THREADS),
            "--burst",
            "--no-scheduler",
            "--poll-interval",
            "0.1",
            env=node_env(galera, galera_db, node),
        )
        for node, count in PROCESSES.items()
    ]
    for supervisor in supervisors:
        assert supervisor.wait(timeout=240) == 0, supervisor.log()
    elapsed = time.monotonic() - started  # reported, never asserted
    logs = [supervisor.log() for supervisor in supervisors]

    # Exactly one side effect per task, as every node sees it.
    for rows in on_every_node(
        galera,
        galera_db,
        "SELECT COUNT(*), COUNT(DISTINCT `key`) FROM testapp_sideeffect WHERE `key` LIKE 'g%'",
    ):
        assert rows == [[str(TASKS), str(TASKS)]]
    # Every task succeeded at its first attempt: a lost race never cost one.
    successful = TaskStatus.SUCCESSFUL.value
    for rows in on_every_node(
        galera,
        galera_db,
        "SELECT status, attempts, JSON_LENGTH(history), COUNT(*) FROM django_rdbtasks_task "
        "GROUP BY status, attempts, JSON_LENGTH(history)",
    ):
        assert rows == [[successful, "1", "1", str(TASKS)]]

    # The race was run: Galera failed conflicting commits, the workers met
    # them as error 1213, and took each for a lost race, never for an outage.
    certified_away = conflicts(galera) - before
    races = sum(log.count(RACE_LINE) for log in logs)
    print(
        f"\n{TASKS} tasks in {elapsed:.1f}s; conflicts counted by Galera: {certified_away}; "
        f"lost races the workers retried: {races}"
    )
    assert certified_away > 0
    assert races > 0
    assert all("1213" in line for log in logs for line in log.splitlines() if RACE_LINE in line)
    for log in logs:
        # Not as an outage (retry_database), nor as a failed renewal or write
        # (the lease keeper): no warning at all, and nothing raised.
        loud = [line for line in log.splitlines() if " WARNING [" in line or " ERROR [" in line]
        assert loud == [], "\n".join(loud)
        assert "Traceback" not in log, log


def test_schedulers_on_three_nodes_fire_each_tick_exactly_once(galera, galera_db, run_workers):
    """Cron jobs: three schedulers, one per node, race over the same due ticks."""
    jobs, rounds = 100, 2
    base = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=30)).replace(second=0, microsecond=0)
    manage(
        galera,
        galera_db,
        1,
        "shell",
        "-c",
        "from django_rdbtasks.models import Job\n"
        # Yearly: no tick of their own comes due while the test sets them due.
        "Job.objects.bulk_create(Job(name=f'job-{i}', cron='0 0 1 1 *', next_run_at=None, "
        "task_path='tests.testapp.tasks.record_job', kwargs={'job': f'job-{i}'}) "
        f"for i in range({jobs}))",
    )
    before = conflicts(galera)
    schedulers = [
        run_workers(
            "--processes", "0", "--poll-interval", "0.1", env=node_env(galera, galera_db, node)
        )
        for node in (1, 2, 3)
    ]
    records = "SELECT COUNT(*) FROM django_rdbtasks_jobrecord WHERE job_name LIKE 'job-%'"
    for round_ in range(rounds):
        tick = base + dt.timedelta(minutes=round_)
        # Time "passes": every job is due at this round's tick, as after an edit.
        galera.query(
            1,
            f"USE `{galera_db}`; UPDATE django_rdbtasks_job SET next_run_at = "
            f"'{tick:%Y-%m-%d %H:%M:%S}', version = {round_ * 10 + 1} WHERE name LIKE 'job-%'",
        )
        expected = [[str(jobs * (round_ + 1))]]

        def fired(expected: list[list[str]] = expected) -> bool:
            return galera.query(1, f"USE `{galera_db}`; {records}") == expected

        if not wait_for(fired, timeout=120):
            pytest.fail(
                f"round {round_}: {galera.query(1, f'USE `{galera_db}`; {records}')} records\n"
                + "\n".join(s.log()[-3000:] for s in schedulers)
            )
    time.sleep(1)  # a late duplicate would show up now
    for scheduler in schedulers:
        scheduler.signal(signal.SIGTERM)
    for scheduler in schedulers:
        assert scheduler.wait(timeout=60) == 0, scheduler.log()

    for rows in on_every_node(
        galera,
        galera_db,
        f"{records}; SELECT COUNT(DISTINCT job_name, `key`) FROM django_rdbtasks_jobrecord "
        "WHERE job_name LIKE 'job-%'; "
        "SELECT COUNT(*) FROM django_rdbtasks_task WHERE job_name LIKE 'job-%'",
    ):
        assert rows == [[str(jobs * rounds)]] * 3
    print(f"\nscheduler conflicts counted by Galera: {conflicts(galera) - before}")
    for scheduler in schedulers:
        log = scheduler.log()
        loud = [line for line in log.splitlines() if " WARNING [" in line or " ERROR [" in line]
        assert loud == [], "\n".join(loud)
        assert "Traceback" not in log, log


def test_sagas_on_three_nodes_compensate_each_step_once_in_reverse_order(
    galera, galera_db, run_workers
):
    """Fan-out sagas: steps of one workflow settle on different nodes at once."""
    flights, seats = 12, 6
    manage(
        galera,
        galera_db,
        1,
        "shell",
        "-c",
        "from tests.testapp.saga_tasks import enqueue_flight\n"
        f"for flight in range({flights}): enqueue_flight(flight, {seats}, seconds=0.05)",
    )
    supervisors = [
        run_workers(
            "--processes",
            "2",
            "--threads",
            "2",
            "--burst",
            "--no-scheduler",
            "--poll-interval",
            "0.1",
            env=node_env(galera, galera_db, node),
        )
        for node in (1, 2, 3)
    ]
    for supervisor in supervisors:
        assert supervisor.wait(timeout=240) == 0, supervisor.log()
    states = "SELECT state, COUNT(*) FROM django_rdbtasks_workflow GROUP BY state"
    freed = (
        "SELECT COUNT(*), COUNT(DISTINCT `key`) FROM testapp_sideeffect WHERE `key` LIKE 'free:%'"
    )
    held = "SELECT COUNT(*) FROM testapp_sideeffect WHERE `key` LIKE 'hold:%'"
    # Each compensation against the step it undoes: the chain runs one at a
    # time, the step that finished last undone first.
    chain = (
        "SELECT c.started_at, c.finished_at, s.finished_at, s.id, w.workflow_id "
        "FROM django_rdbtasks_workflowstep w "
        "JOIN django_rdbtasks_task c ON c.id = w.task_id "
        "JOIN django_rdbtasks_task s ON s.id = w.undoes_id "
        "WHERE w.role = 'COMPENSATION' ORDER BY w.workflow_id, c.started_at"
    )
    for node_rows in on_every_node(galera, galera_db, f"{states}; {freed}; {held}"):
        assert node_rows[0] == ["COMPENSATED", str(flights)]
        holds = node_rows[2][0]
        assert node_rows[1] == [holds, holds]  # every seat held was freed once
    rows = galera.query(1, f"SET SESSION wsrep_sync_wait = 1; USE `{galera_db}`; {chain}")
    by_workflow: dict[str, list[list[str]]] = {}
    for row in rows:
        by_workflow.setdefault(row[4], []).append(row)
    assert len(by_workflow) == flights
    for undos in by_workflow.values():
        assert [(r[2], r[3]) for r in undos] == sorted(((r[2], r[3]) for r in undos), reverse=True)
        for before, after in itertools.pairwise(undos):
            assert before[1] <= after[0]
    for supervisor in supervisors:
        log = supervisor.log()
        loud = [line for line in log.splitlines() if " WARNING [" in line]
        assert loud == [], "\n".join(loud)


def test_limits_on_three_nodes_hold_and_new_keys_slots_are_made_once(
    galera, galera_db, run_workers
):
    """Workers on every node meet the same new keys at once.

    Each key's slots are made by whichever workers find them missing: a
    second node's insert of the same slots loses certification (1213), which
    is a lost race, dropped; a claim taking a slot another node took is
    retried. No key ever runs more than its limit, and each has its N slots.
    """
    count, tenants = 600, 5
    manage(
        galera,
        galera_db,
        1,
        "shell",
        "-c",
        "from django_rdbtasks.backend import bulk_enqueue\n"
        "from tests.testapp import tasks\n"
        f"bulk_enqueue(tasks.per_tenant, [((f't{{i % {tenants}}}', 0.01), {{}}) "
        f"for i in range({count})])",
    )
    supervisors = [
        run_workers(
            *("--processes", "2", "--threads", "2", "--burst", "--no-scheduler"),
            *("--poll-interval", "0.05"),
            env=node_env(galera, galera_db, node),
        )
        for node in (1, 2, 3)
    ]
    for supervisor in supervisors:
        assert supervisor.wait(timeout=300) == 0, supervisor.log()
    sync = f"SET SESSION wsrep_sync_wait = 1; USE `{galera_db}`; "
    runs = galera.query(1, sync + "SELECT `key`, started_at, finished_at FROM testapp_limitedrun")
    assert len(runs) == count  # each ran once
    by_tenant: dict[str, list[tuple[dt.datetime, dt.datetime]]] = {}
    for key, started, finished in runs:
        span = (dt.datetime.fromisoformat(started), dt.datetime.fromisoformat(finished))
        by_tenant.setdefault(key, []).append(span)
    assert {key: max_overlap(spans) <= 3 for key, spans in by_tenant.items()} == {
        f"t{i}": True for i in range(tenants)
    }
    slots = "SELECT `key`, COUNT(*) FROM django_rdbtasks_limitslot GROUP BY `key` ORDER BY 1"
    # This test's tasks only: the cluster's database is the module's.
    done = (
        "SELECT COUNT(*) FROM django_rdbtasks_task WHERE status = 'SUCCESSFUL' "
        "AND attempts = 1 AND task_path = 'tests.testapp.tasks.per_tenant'"
    )
    for node_rows in on_every_node(galera, galera_db, f"{slots}; {done}"):
        assert node_rows[:tenants] == [[f"concurrency:tenant:t{i}", "3"] for i in range(tenants)]
        assert node_rows[tenants] == [str(count)]
    for supervisor in supervisors:
        loud = [line for line in supervisor.log().splitlines() if " WARNING [" in line]
        assert loud == [], "\n".join(loud)


def test_skip_locked_mode_is_refused_on_a_galera_node(galera, galera_db, run_workers):
    worker = run_workers(
        "--mode", "skip-locked", "--burst", "--no-scheduler", env=node_env(galera, galera_db, 2)
    )
    assert worker.wait(timeout=60) != 0
    log = worker.log()
    assert "--mode skip-locked is refused on a Galera cluster (wsrep_on is ON)" in log, log
    assert "Use the default optimistic mode" in log


def test_a_conflict_certified_away_is_error_1213_and_a_lost_race(galera, galera_db):
    """Two nodes update the same row, both see it match, both commit: the second loses."""
    galera.query(
        1,
        f"USE `{galera_db}`; CREATE TABLE IF NOT EXISTS galera_probe "
        "(id INT PRIMARY KEY, n INT NOT NULL); REPLACE INTO galera_probe VALUES (1, 0)",
    )
    sessions = [
        MySQLdb.connect(host="127.0.0.1", port=port, user="root", database=galera_db)
        for port in (23061, 23062)
    ]
    try:
        for session in sessions:
            with session.cursor() as cursor:
                cursor.execute("SET SESSION wsrep_sync_wait = 1")
                cursor.execute("BEGIN")
                cursor.execute("UPDATE galera_probe SET n = n + 1 WHERE id = 1")
                assert cursor.rowcount == 1  # local locks: both think they won
        sessions[0].commit()
        with pytest.raises(MySQLdb.OperationalError) as lost:
            sessions[1].commit()  # or aborted already by node 1's write set
        assert lost.value.args[0] == 1213
        assert is_lost_race(lost.value)
    finally:
        for session in sessions:
            session.close()
    assert galera.query(1, f"SELECT n FROM `{galera_db}`.galera_probe")[0] == ["1"]


def test_the_script_reports_the_cluster_and_refuses_a_second_one_on_its_ports(galera):
    script = [sys.executable, str(ROOT / "scripts/clusters/galera.py")]
    status = subprocess.run(
        [*script, "status", str(galera.base)], capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stderr
    assert status.stdout.count("Synced, cluster size 3") == 3, status.stdout
    with tempfile.TemporaryDirectory() as other:
        second = subprocess.run(
            [*script, "start", other], capture_output=True, text=True, timeout=60
        )
    assert second.returncode == 1
    assert "ports in use on 127.0.0.1" in second.stderr, second.stderr
    assert len(galera.running()) == 3  # the first cluster was left alone


def test_a_node_set_read_only_is_not_taken_for_one_that_accepts_writes(galera, galera_db):
    """After a failover a task's new connection may reach a server that is now a
    replica, set read_only as MariaDB's and MySQL's replicas are: the runner's
    check before the task (``Dialect.accepts_writes``) refuses it, as it refuses
    a PostgreSQL standby, and takes it again once it accepts writes."""
    from django.db import connections

    from django_rdbtasks.db import dialect_for

    dialect = dialect_for(connections["default"])
    sessions = {
        node: MySQLdb.connect(host="127.0.0.1", port=23060 + node, user="root", database=galera_db)
        for node in (1, 2)
    }

    def accepts(node: int) -> bool:
        with sessions[node].cursor() as cursor:
            return dialect.accepts_writes(cursor)

    try:
        assert accepts(1) and accepts(2)
        galera.query(2, "SET GLOBAL read_only = 1")
        try:
            assert not accepts(2) and accepts(1)
        finally:
            galera.query(2, "SET GLOBAL read_only = 0")
        assert accepts(2)
    finally:
        for session in sessions.values():
            session.close()
