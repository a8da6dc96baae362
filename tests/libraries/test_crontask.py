"""django-crontask on this backend: its scheduler enqueues, the worker runs.

django-crontask needs Django 6.0+ and Python 3.12+: these tests run on the
Django 6.1 line only (tests/settings_libraries.py installs it there).
"""

import os
import signal
import subprocess
import sys

import pytest

from django_rdbtasks.compat import HAS_DJANGO_TASKS
from django_rdbtasks.models import Task
from django_rdbtasks.worker import Worker
from tests.conftest import ROOT, wait_until

pytestmark = [
    pytest.mark.skipif(
        not HAS_DJANGO_TASKS, reason="django-crontask needs Django 6.0+ (the 6.1 line here)"
    ),
    # Every test here puts back what the migrations made (see test_wagtail.py).
    pytest.mark.django_db(transaction=True, serialized_rollback=True),
]


def test_the_heartbeat_the_scheduler_fires_is_run_by_the_worker():
    """What ``manage.py crontask`` does each minute, without waiting for the minute."""
    import importlib

    from crontask import scheduler

    importlib.import_module("crontask.tasks")  # as the crontask command does
    (job,) = [job for job in scheduler.get_jobs() if job.name == "heartbeat"]
    job.func()  # what APScheduler calls at the tick: the task's enqueue
    Worker(burst=True).run(install_signals=False)
    row = Task.objects.get()
    assert (row.task_path, row.status) == ("crontask.tasks.heartbeat", "SUCCESSFUL")


@pytest.mark.slow
def test_the_crontask_scheduler_process_enqueues_ticks_the_worker_runs(tmp_path):
    from tests.testapp.models import SideEffect

    log = open(tmp_path / "crontask.log", "w")
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "django", "crontask", "--no-heartbeat"],
        env={
            **os.environ,
            "RDBTASKS_TEST_WORKER": "1",
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.settings_libraries",
        },
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        ticks = Task.objects.filter(task_path="tests.libraries.cron.tasks.tick")
        wait_until(lambda: ticks.count() >= 2, timeout=60)
    finally:
        scheduler.send_signal(signal.SIGTERM)  # crontask shuts its scheduler down on it
        assert scheduler.wait(timeout=30) == 0, (tmp_path / "crontask.log").read_text()
        log.close()
    enqueued = ticks.count()
    Worker(burst=True).run(install_signals=False)
    assert set(ticks.values_list("status", flat=True)) == {"SUCCESSFUL"}
    assert SideEffect.objects.filter(key="cron-tick").count() == enqueued
