"""One process tree: no child outlives its supervisor, and a group signal is graceful."""

import os
import signal
from pathlib import Path

import pytest

from django_rdbtasks.models import Task
from tests.conftest import wait_until, worker_children
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def alive(pid):
    """Running (a zombie waiting to be reaped counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_sigkill_of_the_supervisor_leaves_no_process(run_workers):
    workers = run_workers("--processes", "2", "--poll-interval", "0.2")
    # Two workers and the scheduler.
    children = wait_until(
        lambda: len(worker_children(workers.pid)) == 3 and worker_children(workers.pid)
    )
    # One process group: a kill of the group reaches every process.
    assert {os.getpgid(child) for child in children} == {os.getpgid(workers.pid)}
    os.kill(workers.pid, signal.SIGKILL)
    workers.process.wait(10)
    wait_until(lambda: not any(alive(child) for child in children), timeout=10)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_process_group_is_one_graceful_stop(run_workers, signum):
    """SIGTERM to the group is what systemd and Kubernetes send; SIGINT to the
    group is Ctrl+C at a terminal. Either way the first one is graceful."""
    tasks.record_then_sleep.enqueue("group", 1.5)
    workers = run_workers("--processes", "2", "--grace", "30", new_session=True)
    wait_until(lambda: SideEffect.objects.filter(key="group").exists(), timeout=60)
    children = worker_children(workers.pid)
    # What systemd or Kubernetes do: every process of the group gets SIGTERM at
    # once, and the supervisor passes one on. That is still one request: the
    # running task finishes within the grace period instead of being abandoned.
    os.killpg(os.getpgid(workers.pid), signum)
    assert workers.wait(timeout=60) == 0, workers.log()
    assert Task.objects.get().status == "SUCCESSFUL"
    assert not any(alive(child) for child in children)
    assert "second signal" not in workers.log()
