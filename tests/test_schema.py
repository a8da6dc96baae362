"""Whether the database has this app's tables: the migrations not applied, the errors that say
a table is missing, and a worker started before ``migrate``."""

import os
import signal
import subprocess
import sys

import pytest
from django.db import DatabaseError, connection

from django_rdbtasks.schema import Reminder, tables_missing, unapplied_migrations, what_to_do
from tests.conftest import ROOT, wait_until
from tests.test_runworkers import EmptyDatabase

pytestmark = pytest.mark.django_db(transaction=True)


def error_of(sql):
    with pytest.raises(DatabaseError) as raised, connection.cursor() as cursor:
        cursor.execute(sql)
    return raised.value


def test_a_missing_table_is_told_from_other_errors():
    assert tables_missing(error_of("SELECT * FROM rdbtasks_no_such_table"))
    assert not tables_missing(error_of("SELEC 1"))


def test_a_migrated_database_misses_nothing():
    assert unapplied_migrations("default", "django_rdbtasks") == []


def test_what_to_do_names_the_missing_tables_or_migrations():
    assert what_to_do(["django_rdbtasks.0001_initial", "django_rdbtasks.0002_x"]) == (
        "the task tables are missing: run manage.py migrate"
    )
    assert what_to_do(["django_rdbtasks.0007_x"]).startswith(
        "1 migrations of the task tables are not applied (django_rdbtasks.0007_x)"
    )


def test_a_reminder_is_due_at_once_then_every_so_often():
    reminder = Reminder(every=30)
    assert [reminder.due(t) for t in (0, 1, 29.9, 30, 31, 60)] == [
        True,
        False,
        False,
        True,
        False,
        True,
    ]


@pytest.mark.slow
def test_a_worker_process_started_without_its_supervisor_says_what_to_do(vendor, tmp_path):
    # The supervisor waits for migrate before it forks; a worker it started
    # while the database did not answer meets the missing tables itself.
    empty = EmptyDatabase(vendor)
    log = open(tmp_path / "worker.log", "w")
    code = (
        "import sys, django; django.setup(); from django_rdbtasks.worker import Worker; "
        "sys.exit(Worker(poll_interval=0.1).run())"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        **empty.env,
    }
    worker = subprocess.Popen(
        [sys.executable, "-c", code], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        text = lambda: (tmp_path / "worker.log").read_text()  # noqa: E731
        wait_until(lambda: "the task tables are missing: run manage.py migrate" in text(), 60)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, text()
        assert text().count("run manage.py migrate") == 1, text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        log.close()
        empty.drop()
