"""The supervisor's options and its autoscaling in real processes."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
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


# -- how a process ended: said in the log, marked in the worker registry -------------------


def registrations() -> dict[int, bool]:
    """Each registered worker process's pid, and whether it is marked stopped."""
    from django_rdbtasks.models import Worker

    return {
        pid: stopped is not None for pid, stopped in Worker.objects.values_list("pid", "stopped_at")
    }


def registered(pid: int) -> bool:
    return pid in registrations()


def _one_registered_worker(supervisor_pid: int) -> int:
    def found():
        alive = [pid for pid, stopped in registrations().items() if not stopped]
        children = set(worker_children(supervisor_pid))
        return [pid for pid in alive if pid in children]

    return wait_until(found, timeout=60)[0]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_graceful_stop_marks_every_registration_stopped(run_workers):
    workers = run_workers("--processes", "2", "--no-scheduler")
    wait_until(lambda: len(registrations()) == 2, timeout=60)
    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=60) == 0, workers.log()
    assert list(registrations().values()) == [True, True]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_process_recycled_after_max_tasks_is_marked_stopped_and_said_so(run_workers):
    for i in range(3):
        tasks.record.enqueue(f"m{i}")
    workers = run_workers("--max-tasks", "1", "--no-scheduler", "--poll-interval", "0.1")
    wait_until(lambda: SideEffect.objects.count() == 3, timeout=60)
    wait_until(lambda: len(registrations()) >= 4, timeout=60)  # 3 recycled, 1 waiting
    recycled = set(SideEffect.objects.values_list("pid", flat=True))
    wait_until(lambda: all(registrations()[pid] for pid in recycled), timeout=30)
    assert list(registrations().values()).count(False) == 1
    assert workers.log().count("recycled after --max-tasks") >= 3, workers.log()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_process_recycled_for_a_task_past_its_timeout_is_marked_stopped_and_said_so(
    run_workers,
):
    tasks.ignores_timeout.enqueue("stuck", 30)
    workers = run_workers("--no-scheduler", "--poll-interval", "0.1")
    wait_until(lambda: SideEffect.objects.filter(key="stuck").count() == 2, timeout=60)
    first = SideEffect.objects.filter(key="stuck").order_by("id").first().pid
    wait_until(lambda: registrations().get(first), timeout=30)
    log = wait_until(
        lambda: "recycled: a task ran past its timeout" in workers.log() and workers.log(),
        timeout=30,
    )
    assert "--max-tasks" not in log
    assert "restarting" not in log  # not taken for a crash either


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_processes_that_exit_on_a_second_signal_are_marked_stopped(run_workers):
    tasks.record_then_sleep.enqueue("long", 60)
    workers = run_workers(
        "--processes", "2", "--no-scheduler", "--grace", "60", "--lease", "5", new_session=True
    )
    wait_until(lambda: SideEffect.objects.exists(), timeout=60)
    wait_until(lambda: len(registrations()) == 2, timeout=60)
    # Ctrl+C twice at a terminal: SIGINT to the whole process group.
    os.killpg(workers.pid, signal.SIGINT)
    time.sleep(0.5)
    os.killpg(workers.pid, signal.SIGINT)
    workers.wait(timeout=30)
    # The one running the long task left at once (its claim to the lease);
    # both registrations say they are gone, none seems alive for 90 s.
    assert list(registrations().values()) == [True, True], workers.log()
    assert "exited at once on a second signal" in workers.log()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_killed_process_is_marked_stopped_by_the_supervisor_and_replaced(run_workers):
    workers = run_workers("--no-scheduler", "--poll-interval", "0.1")
    victim = _one_registered_worker(workers.pid)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: registrations().get(victim), timeout=30)
    # The supervisor marks the registration before it logs the exit: on a
    # loaded machine the line can come a moment after the mark.
    line = f"worker process {victim} killed by SIGKILL; restarting"
    wait_until(lambda: line in workers.log(), timeout=10)
    successor = _one_registered_worker(workers.pid)
    assert successor != victim and registrations()[successor] is False
