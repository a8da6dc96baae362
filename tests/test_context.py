"""Progress, checkpoints, hand-over, cancel and timeouts, seen from a real database."""

import signal
import threading

import pytest

from django_rdbtasks.compat import TaskResultStatus, task_backends
from django_rdbtasks.models import Task
from django_rdbtasks.worker import Worker
from tests.conftest import wait_until
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def start_worker(**options):
    worker = Worker(poll_interval=0.05, **options)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    return worker, thread


def stop_worker(worker, thread):
    worker.stop()
    thread.join(30)
    assert not thread.is_alive()


def items_done(key):
    return list(SideEffect.objects.filter(key__startswith=f"{key}:").values_list("key", flat=True))


def test_progress_and_checkpoint_are_visible_from_any_process():
    result = tasks.resumable.enqueue("p", 20, 0.03)
    worker, thread = start_worker()
    try:
        wait_until(lambda: (Task.objects.get(pk=result.id).progress or 0) >= 0.25, timeout=30)
        result.refresh()
        assert 0.25 <= result.progress < 1 and result.progress_message.startswith("item")
        row = Task.objects.get(pk=result.id)
        assert row.checkpoint["next"] >= 5
        wait_until(lambda: Task.objects.get(pk=result.id).status == "SUCCESSFUL", timeout=30)
    finally:
        stop_worker(worker, thread)
    row = Task.objects.get(pk=result.id)
    assert (row.progress, row.checkpoint) == (1.0, {"next": 20})


def test_progress_writes_are_throttled():
    result = tasks.resumable.enqueue("t", 200, 0)
    Worker(burst=True).run(install_signals=False)
    row = Task.objects.get(pk=result.id)
    assert row.status == "SUCCESSFUL" and row.checkpoint == {"next": 200}
    assert len(items_done("t")) == 200  # all 200 reported; far fewer writes (interval 0.1s)


def test_deliberate_hand_over_resumes_without_spending_an_attempt():
    result = tasks.rebalancing.enqueue("h")
    worker, thread = start_worker()
    try:
        wait_until(lambda: Task.objects.get(pk=result.id).status == "SUCCESSFUL", timeout=30)
    finally:
        stop_worker(worker, thread)
    row = Task.objects.get(pk=result.id)
    assert row.attempts == 1
    assert [e["outcome"] for e in row.history] == ["HANDED_OVER", "SUCCESSFUL"]
    assert row.return_value == 3  # the second run started at the checkpoint
    assert sorted(items_done("h")) == [f"h:{i}" for i in range(6)]  # each item once


def test_cancel_ready_task_at_once():
    result = tasks.record.enqueue("never")
    assert task_backends["default"].cancel(result.id) == "CANCELLED"
    Worker(burst=True).run(install_signals=False)
    assert not SideEffect.objects.exists()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED  # the framework's nearest status
    assert result.errors[-1].exception_class_path.endswith("TaskCancelled")
    assert Task.objects.get().status == "CANCELLED"


def test_cancel_running_task_through_its_heartbeat():
    result = tasks.until_stopped.using().enqueue("c")
    Task.objects.filter(pk=result.id).update(max_attempts=3)
    worker, thread = start_worker(lease=0.6)
    try:
        wait_until(lambda: SideEffect.objects.filter(key="c").exists(), timeout=30)
        assert task_backends["default"].cancel(result.id) == "RUNNING"
        wait_until(lambda: Task.objects.get(pk=result.id).status == "CANCELLED", timeout=30)
    finally:
        stop_worker(worker, thread)
    row = Task.objects.get(pk=result.id)
    assert row.history[-1]["outcome"] == "CANCELLED"
    assert SideEffect.objects.filter(key="c").count() == 1  # not retried


def test_timeout_asks_the_task_to_stop_and_fails_it():
    result = tasks.until_stopped.enqueue("slow")
    worker, thread = start_worker()
    try:
        wait_until(lambda: Task.objects.get(pk=result.id).status == "FAILED", timeout=30)
    finally:
        stop_worker(worker, thread)
    row = Task.objects.get(pk=result.id)
    assert row.history[-1]["exception_class_path"] == "django_rdbtasks.exceptions.TaskTimeout"


@pytest.mark.slow
def test_a_task_ignoring_its_timeout_gets_its_process_recycled(run_workers):
    result = tasks.ignores_timeout.enqueue("stuck", 30)
    workers = run_workers("--poll-interval", "0.1")
    wait_until(lambda: SideEffect.objects.filter(key="stuck").count() == 2, timeout=60)
    wait_until(lambda: Task.objects.get(pk=result.id).status == "FAILED", timeout=60)
    row = Task.objects.get(pk=result.id)
    assert row.attempts == 2
    assert [e["exception_class_path"] for e in row.history] == [
        "django_rdbtasks.exceptions.TaskTimeout"
    ] * 2
    pids = set(SideEffect.objects.values_list("pid", flat=True))
    assert len(pids) == 2  # a fresh process ran the retry
    assert "recycled" in workers.log()


@pytest.mark.slow
def test_killed_mid_way_resumes_from_the_checkpoint(run_workers):
    items, pause = 60, 0.05
    result = tasks.resumable.enqueue("k", items, pause)
    first = run_workers("--lease", "1", "--no-scheduler")
    wait_until(lambda: len(items_done("k")) >= 15, timeout=60)
    first.stop()  # SIGKILL, supervisor and worker: no release, no last checkpoint
    wait_until(lambda: Task.objects.expired().exists(), timeout=30)
    second = run_workers("--lease", "5", "--burst", "--poll-interval", "0.2")
    assert second.wait(timeout=120) == 0, second.log()
    row = Task.objects.get(pk=result.id)
    assert row.status == "SUCCESSFUL" and row.attempts == 2
    done = items_done("k")
    assert set(done) == {f"k:{i}" for i in range(items)}
    # Redone after the crash: only what came after the last checkpoint write
    # (written at most every PROGRESS_INTERVAL = 0.1 s, one item per 0.05 s).
    assert len(done) - items <= 0.1 / pause + 1


@pytest.mark.slow
def test_graceful_shutdown_hands_the_task_over_with_its_checkpoint(run_workers):
    items = 40
    result = tasks.resumable.enqueue("g", items, 0.05)
    workers = run_workers("--grace", "10", "--no-scheduler")
    wait_until(lambda: len(items_done("g")) >= 10, timeout=60)
    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=60) == 0, workers.log()
    row = Task.objects.get(pk=result.id)
    assert (row.status, row.attempts) == ("READY", 0)
    assert row.history[-1]["outcome"] == "HANDED_OVER"
    resumed_at = row.checkpoint["next"]
    assert resumed_at == len(items_done("g"))  # the checkpoint is exactly where it stopped

    again = run_workers("--burst", "--no-scheduler")
    assert again.wait(timeout=120) == 0, again.log()
    assert sorted(items_done("g"), key=lambda k: int(k.split(":")[1])) == [
        f"g:{i}" for i in range(items)
    ]  # every item exactly once
    assert Task.objects.get(pk=result.id).status == "SUCCESSFUL"
