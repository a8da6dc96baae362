"""Dependencies: release in the parent's transaction, failure propagation, cycles."""

from datetime import timedelta

import pytest
from django.utils import timezone

from django_rdbtasks.dependencies import CycleError, Workflow, enqueue_after
from django_rdbtasks.models import Task
from django_rdbtasks.worker import Worker
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def status(result):
    return Task.objects.get(pk=result.id).status


def order_of_steps():
    return list(SideEffect.objects.order_by("id").values_list("key", flat=True))


def test_child_waits_until_its_parent_succeeded():
    parent = tasks.step.enqueue("a")
    child = enqueue_after([parent], tasks.step, "b")
    assert status(child) == "WAITING"
    assert Task.objects.get(pk=child.id).waiting_on == 1
    child.refresh()
    assert child.status == "READY"  # the framework's nearest status
    Worker(burst=True).run(install_signals=False)
    assert status(parent) == status(child) == "SUCCESSFUL"
    assert order_of_steps() == ["step:a", "step:b"]


def test_a_deferred_child_released_by_its_parent_still_waits_for_its_time():
    parent = tasks.step.enqueue("a")
    later = tasks.step.using(run_after=timezone.now() + timedelta(hours=1))
    child = enqueue_after([parent], later, "b")
    Worker(burst=True).run(install_signals=False)
    row = Task.objects.get(pk=child.id)
    assert row.status == "READY" and row.run_after == row.requested_run_after
    assert not Task.objects.runnable().filter(pk=child.id).exists()
    assert order_of_steps() == ["step:a"]


def test_parent_already_done_means_ready_at_once():
    parent = tasks.step.enqueue("a")
    Worker(burst=True).run(install_signals=False)
    child = enqueue_after([parent.id], tasks.step, "b")
    assert status(child) == "READY"


def test_diamond_runs_each_node_once_in_order():
    flow = Workflow()
    flow.add("a", tasks.step, "a")
    flow.add("b", tasks.step, "b", depends_on=["a"])
    flow.add("c", tasks.step, "c", depends_on=["a"])
    flow.add("d", tasks.step, "d", depends_on=["b", "c"])
    results = flow.enqueue()
    assert [status(results[n]) for n in "abcd"] == ["READY", "WAITING", "WAITING", "WAITING"]
    Worker(burst=True, threads=4).run(install_signals=False)
    steps = order_of_steps()
    assert sorted(steps) == ["step:a", "step:b", "step:c", "step:d"]
    assert steps[0] == "step:a" and steps[-1] == "step:d"


def test_chain():
    flow = Workflow()
    flow.chain(
        ("one", tasks.step, ("1",), {}),
        ("two", tasks.step, ("2",), {}),
        ("three", tasks.step, ("3",), {}),
    )
    flow.enqueue()
    Worker(burst=True).run(install_signals=False)
    assert order_of_steps() == ["step:1", "step:2", "step:3"]


def test_failed_parent_cancels_or_fails_its_dependants_transitively():
    flow = Workflow()
    flow.add("bad", tasks.always_fails, "x")
    flow.add("cancelled", tasks.step, "c", depends_on=["bad"])
    flow.add("failed", tasks.step, "f", depends_on=["bad"], on_parent_failure="FAILED")
    flow.add("grandchild", tasks.step, "g", depends_on=["cancelled"])
    results = flow.enqueue()
    Worker(burst=True).run(install_signals=False)
    assert status(results["bad"]) == "FAILED"
    assert status(results["cancelled"]) == "CANCELLED"
    assert status(results["failed"]) == "FAILED"
    assert status(results["grandchild"]) == "CANCELLED"
    row = Task.objects.get(pk=results["failed"].id)
    assert row.history[-1]["exception_class_path"].endswith("DependencyFailed")
    assert not SideEffect.objects.exists()


def test_cancelling_a_parent_cancels_its_dependants():
    parent = tasks.step.enqueue("p")
    child = enqueue_after([parent], tasks.step, "c")
    parent.task.get_backend().cancel(parent.id)
    assert status(child) == "CANCELLED"


def test_enqueue_after_a_failed_parent_ends_at_once():
    parent = tasks.always_fails.enqueue("x")
    Worker(burst=True).run(install_signals=False)
    child = enqueue_after([parent], tasks.step, "c")
    assert status(child) == "CANCELLED"


def test_cycles_are_refused():
    flow = Workflow()
    flow.add("a", tasks.step, "a", depends_on=["c"])
    flow.add("b", tasks.step, "b", depends_on=["a"])
    flow.add("c", tasks.step, "c", depends_on=["b"])
    with pytest.raises(CycleError, match=r"a -> c -> b -> a"):
        flow.enqueue()
    assert not Task.objects.exists()


def test_unknown_parent_is_refused_and_nothing_is_enqueued():
    with pytest.raises(ValueError, match="Unknown parent"):
        enqueue_after(["00000000-0000-7000-8000-000000000000"], tasks.step, "x")
    assert not Task.objects.exists()


@pytest.mark.slow
def test_diamonds_under_four_racing_worker_processes(run_workers):
    count = 50
    for i in range(count):
        flow = Workflow()
        flow.add("a", tasks.step, f"{i}:a", 0.01)
        flow.add("b", tasks.step, f"{i}:b", 0.01, depends_on=["a"])
        flow.add("c", tasks.step, f"{i}:c", 0.01, depends_on=["a"])
        flow.add("d", tasks.step, f"{i}:d", 0.01, depends_on=["b", "c"])
        flow.enqueue()
    workers = run_workers("--processes", "4", "--burst", "--no-scheduler", "--poll-interval", "0.1")
    assert workers.wait(timeout=300) == 0, workers.log()
    assert Task.objects.filter(status="SUCCESSFUL").count() == 4 * count
    effects = list(SideEffect.objects.order_by("id").values_list("key", "pid"))
    assert len(effects) == 4 * count  # each node ran exactly once
    position = {key: n for n, (key, _) in enumerate(effects)}
    for i in range(count):
        a, b, c, d = (position[f"step:{i}:{n}"] for n in "abcd")
        assert a < b and a < c and b < d and c < d
    assert len({pid for _, pid in effects}) > 1
