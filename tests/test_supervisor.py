"""The supervisor's options and its autoscaling in real processes."""

from __future__ import annotations

import re
import signal
import socket
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_rdbtasks.models import Task
from django_rdbtasks.states import TaskStatus
from tests.conftest import wait_until, worker_children
from tests.test_metrics import _served, scrape, value
from tests.testapp import tasks
from tests.testapp.models import SideEffect

RECORD = "tests.testapp.tasks.record"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--autoscale", "1:4", "--processes", "2"], "--autoscale and --processes cannot"),
        (["--autoscale", "1:4", "--processes", "1"], "--autoscale and --processes cannot"),
        (["--autoscale", "1:4", "--burst"], "--autoscale cannot be used with --burst"),
        (["--autoscale", "4:1"], "0 <= MIN <= MAX"),
        (["--autoscale", "four"], "MIN:MAX"),
        (["--autoscale", "1:2", "--autoscale-interval", "0"], "--autoscale-interval"),
        (["--metrics-port", "70000"], "--metrics-port"),
    ],
)
def test_options_that_cannot_work_are_refused_before_anything_starts(args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("runworkers", *args, stdout=StringIO(), stderr=StringIO())


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_metrics_port_in_use_is_a_clear_error(run_workers):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        workers = run_workers("--metrics-port", str(port), "--no-scheduler")
        assert workers.wait(timeout=60) != 0
    assert f"cannot serve metrics on 127.0.0.1:{port}" in workers.log()
    assert "Traceback" not in workers.log()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_scaled_to_zero_a_task_starts_a_process_that_goes_again_when_idle(run_workers):
    workers = run_workers(
        "--autoscale",
        "0:2",
        "--autoscale-interval",
        "0.2",
        "--autoscale-idle",
        "1",
        "--no-scheduler",
        "--metrics-port",
        "0",
    )
    port, _ = _served(workers)
    assert worker_children(workers.pid) == []  # nothing to do, no process
    assert value(scrape(port), "rdbtasks_worker_processes") == 0
    result = tasks.record.enqueue("woken")
    wait_until(lambda: len(worker_children(workers.pid)) == 1, timeout=60)
    wait_until(lambda: Task.objects.get(pk=result.id).status == TaskStatus.SUCCESSFUL, timeout=60)
    found = scrape(port)
    assert value(found, "rdbtasks_tasks_succeeded_total", queue="default", task=RECORD) == 1
    wait_until(lambda: worker_children(workers.pid) == [], timeout=60)
    # The gauge follows the count; the stopped process's counts stay.
    found = wait_until(
        lambda: (f := scrape(port)) and not value(f, "rdbtasks_worker_processes") and f
    )
    assert value(found, "rdbtasks_tasks_succeeded_total", queue="default", task=RECORD) == 1
    assert workers.process.poll() is None  # still supervising, with no child
    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=60) == 0, workers.log()
    assert SideEffect.objects.filter(key="woken").count() == 1
    log = workers.log()
    assert "autoscale: 0 -> 1 worker processes" in log and "autoscale: 1 -> 0" in log, log
    assert "restarting" not in log  # the process let go was not restarted


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_process_stopped_by_the_autoscaler_finishes_its_running_task(run_workers):
    # The first process takes "first"; then "long" and "last" make a backlog
    # that brings a second process, which takes "long" (the first is busy).
    # Once only "long" runs, the policy stops the newest process: the one
    # running it. SIGTERM is a graceful stop: the task finishes, once.
    tasks.record_then_sleep.enqueue("first", 3.0)
    workers = run_workers(
        "--autoscale",
        "1:2",
        "--autoscale-backlog",
        "1",
        "--autoscale-interval",
        "0.2",
        "--autoscale-idle",
        "0.5",
        "--no-scheduler",
        "--grace",
        "30",
    )
    wait_until(lambda: SideEffect.objects.filter(key="first").exists(), timeout=60)
    tasks.record_then_sleep.enqueue("long", 4.0)
    tasks.record_then_sleep.enqueue("last", 0.1)
    stopped = wait_until(
        lambda: re.search(r"worker process (\d+) stopped \(autoscale\)", workers.log()),
        timeout=60,
    )
    wait_until(lambda: Task.objects.filter(status=TaskStatus.SUCCESSFUL).count() == 3, timeout=60)
    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=60) == 0, workers.log()
    assert Task.objects.filter(status=TaskStatus.SUCCESSFUL, attempts=1).count() == 3
    assert SideEffect.objects.count() == 3  # each body once: nothing cut, nothing rerun
    assert SideEffect.objects.get(key="long").pid == int(stopped.group(1))
    assert "autoscale: 1 -> 2" in workers.log() and "autoscale: 2 -> 1" in workers.log()
