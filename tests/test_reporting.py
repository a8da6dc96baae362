"""What the worker tells of each outcome: the signal, from a thread of the lane's own."""

import threading

import pytest

from django_rdbtasks.compat import framework_signals
from django_rdbtasks.models import Task
from django_rdbtasks.worker import Worker
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def finished_seen():
    """(task id, status, thread name) of every task_finished, and an id to make raise."""
    seen: list[tuple[str, str, str]] = []
    failing: set[str] = set()

    def receiver(sender, task_result, **kwargs):
        seen.append((task_result.id, task_result.status, threading.current_thread().name))
        if task_result.id in failing:
            raise RuntimeError("a receiver's own bug")

    framework_signals.task_finished.connect(receiver, weak=False)
    try:
        yield seen, failing
    finally:
        framework_signals.task_finished.disconnect(receiver)


def test_every_task_finished_is_sent_before_the_worker_returns(finished_seen):
    seen, _ = finished_seen
    results = [tasks.add.enqueue(i, i) for i in range(40)]
    assert Worker(burst=True).run(install_signals=False) == 0
    assert sorted(task_id for task_id, _, _ in seen) == sorted(r.id for r in results)
    assert {str(status) for _, status, _ in seen} == {"SUCCESSFUL"}
    # Told off the round thread, which went back to the database meanwhile.
    assert {thread for _, _, thread in seen} == {"rdbtasks-report-0"}


def test_a_receiver_that_raises_costs_neither_results_nor_other_signals(finished_seen, caplog):
    seen, failing = finished_seen
    results = [tasks.add.enqueue(i, i) for i in range(20)]
    failing.update(r.id for r in results[::3])
    assert Worker(burst=True).run(install_signals=False) == 0
    assert Task.objects.filter(status="SUCCESSFUL").count() == 20
    assert sorted(task_id for task_id, _, _ in seen) == sorted(r.id for r in results)
    assert caplog.text.count("a task_finished receiver failed") == len(failing)
