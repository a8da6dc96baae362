"""Sagas: a workflow's compensations, run once each, in reverse order, visibly."""

import copy
import itertools
import os
import signal
import threading

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from django_rdbtasks.compat import HAS_DJANGO_TASKS, InvalidTask
from django_rdbtasks.dependencies import Workflow
from django_rdbtasks.limits import ConcurrencyLimit
from django_rdbtasks.models import LimitSlot, Task, TaskDependency, WorkflowStep
from django_rdbtasks.models import Workflow as WorkflowRow
from django_rdbtasks.states import StepRole, WorkflowState
from django_rdbtasks.worker import Worker
from tests.conftest import wait_until
from tests.testapp import saga_tasks as saga
from tests.testapp import tasks
from tests.testapp.models import SideEffect

if HAS_DJANGO_TASKS:
    from django.tasks import task
else:
    from django_tasks import task

pytestmark = pytest.mark.django_db(transaction=True)


@task()
def undo_outside_the_apps(order_id, sku, *, step_result):
    """In this module, which workers do not import: refused as a compensation."""


order = saga.enqueue_order


def workflow_of(result):
    return WorkflowStep.objects.get(task_id=result.id).workflow


def effects(prefix):
    """Keys of the SideEffect rows starting with ``prefix``, in the order they were written."""
    rows = SideEffect.objects.filter(key__startswith=prefix).order_by("id")
    return list(rows.values_list("key", flat=True))


def drain():
    Worker(burst=True, poll_interval=0.05).run(install_signals=False)


# -- what enqueue refuses ----------------------------------------------------------------


def test_compensate_with_must_be_a_task():
    flow = Workflow()
    with pytest.raises(InvalidTask, match="must be a task"):
        flow.add("a", saga.reserve_stock, 1, "x", compensate_with=lambda: None)


def test_compensate_with_must_use_the_steps_backend():
    elsewhere = copy.copy(saga.release_stock)
    object.__setattr__(elsewhere, "backend", "elsewhere")  # no such backend is configured
    with pytest.raises(InvalidTask, match="same"):
        Workflow().add("a", saga.reserve_stock, 1, "x", compensate_with=elsewhere)


def test_compensate_with_cannot_have_a_dedup_key():
    with pytest.raises(InvalidTask, match="dedup_key"):
        Workflow().add("a", saga.reserve_stock, 1, "x", compensate_with=tasks.sync_account)


def test_a_step_cannot_take_the_step_result_keyword():
    with pytest.raises(InvalidTask, match="step_result"):
        Workflow().add("a", tasks.add, 1, step_result=2, compensate_with=saga.release_stock)


def test_compensate_with_must_take_the_steps_arguments_and_its_result():
    with pytest.raises(InvalidTask, match="cannot be called as"):
        Workflow().add("a", saga.reserve_stock, 1, "x", compensate_with=saga.recall_shipment)
    with pytest.raises(InvalidTask, match="cannot be called as"):
        Workflow().add("a", tasks.add, 1, 2, compensate_with=tasks.noop)


def test_compensate_with_must_be_loadable_by_workers():
    flow = Workflow()
    flow.add("a", saga.reserve_stock, 1, "x", compensate_with=undo_outside_the_apps)
    with pytest.raises(InvalidTask, match="not part of an installed app"):
        flow.enqueue()
    assert not Task.objects.exists() and not WorkflowRow.objects.exists()


def test_steps_of_a_saga_depend_only_on_each_other():
    outside = tasks.noop.enqueue()
    flow = Workflow()
    flow.add(
        "a", saga.reserve_stock, 1, "x", depends_on=[outside.id], compensate_with=saga.release_stock
    )
    with pytest.raises(ValueError, match="not steps of the workflow"):
        flow.enqueue()
    assert Task.objects.count() == 1 and not WorkflowRow.objects.exists()


def test_a_workflow_without_compensations_has_no_row():
    flow = Workflow()
    flow.add("a", tasks.noop)
    flow.enqueue()
    assert not WorkflowRow.objects.exists()


# -- state transitions, in process -------------------------------------------------------


def test_every_step_succeeds():
    results = order(1, then=tasks.record)
    workflow = workflow_of(results["reserve"])
    assert workflow.state == WorkflowState.RUNNING and workflow.name == "order 1"
    assert sorted(workflow.steps.values_list("name", flat=True)) == [
        "charge",
        "notify",
        "reserve",
        "ship",
    ]
    drain()
    workflow.refresh_from_db()
    assert workflow.state == WorkflowState.SUCCEEDED and workflow.finished_at is not None
    assert not workflow.steps.filter(role=StepRole.COMPENSATION).exists()
    assert effects("release") == effects("refund") == []


def test_ship_fails_and_both_compensations_run_once_in_reverse_order():
    results = order(2)
    drain()
    workflow = workflow_of(results["ship"])
    assert workflow.state == WorkflowState.COMPENSATED, workflow.reason
    assert "'ship'" in workflow.reason
    assert effects("ship-run") == ["ship-run:2"] * 2  # its own retries, then for good
    assert effects("refund:") + effects("release:") == ["refund:2", "release:2"]
    # Refund (undoing the later step) before release, one after the other.
    assert [key.split(":")[0] for key in effects("re")][-4:] == [
        "refund-run",
        "refund",
        "release-run",
        "release",
    ]
    assert Task.objects.get(pk=results["notify"].id).status == "CANCELLED"
    undos = {
        step.name: step
        for step in workflow.steps.filter(role=StepRole.COMPENSATION).select_related("task")
    }
    assert set(undos) == {"undo reserve", "undo charge"}
    assert str(undos["undo charge"].undoes_id) == results["charge"].id
    refund = undos["undo charge"].task
    assert refund.status == "SUCCESSFUL"
    assert refund.args == [2, 42] and refund.kwargs == {
        "pause_refund": False,
        "step_result": {"charge": "C-2-42"},
    }
    # The chain: release waits for the refund.
    release = undos["undo reserve"].task
    assert TaskDependency.objects.filter(parent=refund, child=release).exists()


def test_a_compensation_that_fails_for_good_leaves_the_workflow_failed_to_compensate():
    results = order(3, refund=saga.refund_fails)
    drain()
    workflow = workflow_of(results["reserve"])
    assert workflow.state == WorkflowState.FAILED_TO_COMPENSATE
    assert "undo charge" in workflow.reason and workflow.finished_at is not None
    assert effects("refund-run") == ["refund-run:3"] * 2  # it had its own retries
    release = workflow.steps.get(name="undo reserve").task
    assert release.status == "CANCELLED"  # after a failed one: left, and said so
    assert effects("release") == []


def test_a_step_still_running_when_another_fails_is_compensated_after_it_succeeds():
    flow = Workflow()
    flow.add("slow", saga.reserve_stock, 4, "slow", 1.5, compensate_with=saga.release_stock)
    flow.add("fails", saga.ship, 4)
    results = flow.enqueue()
    # Two threads: the slow step runs while the other fails twice.
    Worker(burst=True, threads=2, poll_interval=0.05).run(install_signals=False)
    workflow = workflow_of(results["slow"])
    assert workflow.state == WorkflowState.COMPENSATED
    slow = Task.objects.get(pk=results["slow"].id)
    failed = Task.objects.get(pk=results["fails"].id)
    assert slow.status == "SUCCESSFUL" and failed.status == "FAILED"
    assert failed.finished_at < slow.finished_at  # it was in flight when the other failed
    undo = workflow.steps.get(role=StepRole.COMPENSATION).task
    assert undo.enqueued_at >= slow.finished_at
    assert effects("release:") == ["release:4"]


def test_an_operator_cancelling_a_step_compensates_the_steps_done():
    from django_rdbtasks.compat import task_backends

    flow = Workflow()
    flow.add("reserve", saga.reserve_stock, 6, "sku", compensate_with=saga.release_stock)
    flow.add(
        "charge", saga.charge_card, 6, 9, depends_on=["reserve"], compensate_with=saga.refund_card
    )
    flow.add("other", tasks.record, "other:6")
    results = flow.enqueue()
    Worker(burst=True, max_tasks=1).run(install_signals=False)  # reserve only
    assert Task.objects.get(pk=results["reserve"].id).status == "SUCCESSFUL"
    assert task_backends["default"].cancel(results["other"].id) == "CANCELLED"
    workflow = workflow_of(results["reserve"])
    assert workflow.state == WorkflowState.COMPENSATING
    assert Task.objects.get(pk=results["charge"].id).status == "CANCELLED"  # never started
    drain()
    workflow.refresh_from_db()
    assert workflow.state == WorkflowState.COMPENSATED
    assert effects("release:") == ["release:6"] and effects("refund") == []


def test_a_step_requeued_after_the_compensation_is_undone_too_when_it_succeeds():
    from django_rdbtasks.compat import task_backends

    flow = Workflow(name="order 10")
    flow.add("reserve", saga.reserve_stock, 10, "sku", compensate_with=saga.release_stock)
    flow.add(
        "ship",
        saga.ship_when_courier,
        10,
        depends_on=["reserve"],
        compensate_with=saga.recall_shipment,
    )
    results = flow.enqueue()
    drain()
    workflow = workflow_of(results["ship"])
    assert workflow.state == WorkflowState.COMPENSATED
    assert effects("release:") == ["release:10"] and effects("recall") == []
    # An operator requeues the failed step, and this time it succeeds.
    SideEffect.objects.create(key="courier:10")
    assert task_backends["default"].requeue(results["ship"].id)
    drain()
    workflow.refresh_from_db()
    assert Task.objects.get(pk=results["ship"].id).status == "SUCCESSFUL"
    assert workflow.state == WorkflowState.COMPENSATED, workflow.reason
    assert effects("recall:") == ["recall:10"] and effects("release:") == ["release:10"]
    recall = workflow.steps.get(name="undo ship")
    assert str(recall.undoes_id) == results["ship"].id and recall.task.status == "SUCCESSFUL"


def test_a_step_requeued_while_compensations_run_is_undone_after_them():
    from django_rdbtasks.compat import task_backends

    flow = Workflow(name="order 11")
    flow.add("reserve", saga.reserve_stock, 11, "sku-1", compensate_with=saga.release_stock)
    flow.add(
        "charge", saga.charge_card, 11, 42, depends_on=["reserve"], compensate_with=saga.refund_card
    )
    flow.add(
        "ship",
        saga.ship_when_courier,
        11,
        depends_on=["charge"],
        compensate_with=saga.recall_shipment,
    )
    results = flow.enqueue()
    Worker(burst=True, max_tasks=3).run(install_signals=False)  # reserve, charge, ship fails
    workflow = workflow_of(results["ship"])
    assert workflow.state == WorkflowState.COMPENSATING
    SideEffect.objects.create(key="courier:11")
    assert task_backends["default"].requeue(results["ship"].id)
    Worker(burst=True, max_tasks=1).run(install_signals=False)  # the refund
    assert effects("refund:") == ["refund:11"] and effects("release:") == []
    drain()  # ship (requeued before release was due) succeeds while release waits
    workflow.refresh_from_db()
    assert workflow.state == WorkflowState.COMPENSATED, workflow.reason
    undone = ["refund:11", "release:11", "recall:11"]
    rows = SideEffect.objects.filter(key__in=undone).order_by("id")
    assert list(rows.values_list("key", flat=True)) == undone
    recall = workflow.steps.get(name="undo ship").task
    release = workflow.steps.get(name="undo reserve").task
    assert TaskDependency.objects.filter(parent=release, child=recall).exists()


# -- admin ---------------------------------------------------------------------------------


# -- lock order --------------------------------------------------------------------------


def test_cancelling_a_saga_step_locks_its_workflow_before_the_step(vendor):
    """As a settling worker does: else each holds the row the other waits for.

    Another session holds the workflow's row; the cancel must wait for it
    without having locked the step, so that session can still lock the step.
    """
    from django.db import close_old_connections, connection, connections

    from django_rdbtasks.compat import task_backends

    if vendor == "sqlite":
        pytest.skip("SQLite has no row locks: one writer holds the whole database")
    results = order(30)
    step = Task.objects.get(pk=results["reserve"].id)
    assert step.status == "READY"
    workflow = workflow_of(results["reserve"])
    holder = connections.create_connection("default")
    outcome = {}

    def cancel():
        try:
            with connection.cursor() as cursor:  # a bound: a lost test fails, not hangs
                if vendor == "postgresql":
                    cursor.execute("SET lock_timeout = '20s'")
                    cursor.execute("SELECT pg_backend_pid()")
                else:
                    cursor.execute("SET SESSION innodb_lock_wait_timeout = 20")
                    cursor.execute("SELECT CONNECTION_ID()")
                outcome["session"] = cursor.fetchone()[0]
            outcome["status"] = task_backends["default"].cancel(str(step.pk))
        except Exception as exc:
            outcome["error"] = exc
        finally:
            close_old_connections()
            connection.close()

    def cancel_waits_for_a_lock():
        if "error" in outcome or "status" in outcome:
            return True  # it did not wait: the assertions below say why
        if "session" not in outcome:
            return False
        with connection.cursor() as cursor:
            if vendor == "postgresql":
                cursor.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                    [outcome["session"]],
                )
            else:
                cursor.execute(
                    "SELECT 1 FROM information_schema.innodb_trx "
                    "WHERE trx_mysql_thread_id = %s AND trx_state = 'LOCK WAIT'",
                    [outcome["session"]],
                )
            return cursor.fetchone() is not None

    holder.set_autocommit(False)
    thread = threading.Thread(target=cancel)
    try:
        with holder.cursor() as cursor:
            cursor.execute(
                f"UPDATE {WorkflowRow._meta.db_table} SET version = version + 1 WHERE id = %s",
                [WorkflowRow._meta.pk.get_db_prep_value(workflow.pk, holder)],
            )
        thread.start()
        wait_until(cancel_waits_for_a_lock)
        assert "status" not in outcome and "error" not in outcome, outcome
        # The step's row is not locked by the waiting cancel: NOWAIT takes it.
        with holder.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {Task._meta.db_table} WHERE id = %s FOR UPDATE NOWAIT",
                [Task._meta.pk.get_db_prep_value(step.pk, holder)],
            )
            assert cursor.fetchone() is not None
    finally:
        holder.rollback()
        thread.join(30)
        holder.close()
    assert outcome.get("status") == "CANCELLED", outcome
    workflow.refresh_from_db()
    assert workflow.state == WorkflowState.COMPENSATED  # nothing had succeeded


# -- limits: a compensation runs under its own, as any enqueue would -----------------------


def compensation_of(results):
    return workflow_of(results["book"]).steps.get(role=StepRole.COMPENSATION).task


def test_a_singleton_compensation_of_two_workflows_never_runs_beside_itself():
    stays = [saga.enqueue_stay("h1", room, saga.cancel_room_alone) for room in (1, 2)]
    # Both books succeed, both ships fail: two compensations, enqueued apart.
    Worker(burst=True, threads=2, poll_interval=0.05).run(install_signals=False)
    undos = [compensation_of(results) for results in stays]
    key = f"concurrency:{saga.cancel_room_alone.module_path}"
    assert [(u.limit_key, u.limit_count, u.status) for u in undos] == [(key, 1, "SUCCESSFUL")] * 2
    assert list(LimitSlot.objects.filter(key=key).values_list("slot_no", flat=True)) == [0]
    # Side effects: each run ended before the other started.
    marks = [mark.split(":")[0] for mark in effects("alone-")]
    assert marks == ["alone-start", "alone-end"] * 2


def test_a_compensations_limit_key_is_computed_from_the_steps_arguments():
    results = saga.enqueue_stay("h2", 7, saga.cancel_room_per_hotel)
    drain()
    undo = compensation_of(results)
    limit = (undo.limit_key, undo.limit_count, undo.status)
    assert limit == ("concurrency:hotel:h2", 1, "SUCCESSFUL")
    assert LimitSlot.objects.filter(key="concurrency:hotel:h2").count() == 1
    assert effects("cancel:") == ["cancel:h2/7"]


def test_a_compensation_whose_key_cannot_be_computed_runs_under_the_default_key():
    """The step's outcome is being written: not refused, and not unlimited either."""
    results = saga.enqueue_stay("h4", 2, saga.cancel_room_bad_key)
    drain()
    undo = compensation_of(results)
    key = f"concurrency:{saga.cancel_room_bad_key.module_path}"
    assert (undo.limit_key, undo.limit_count, undo.status) == (key, 1, "SUCCESSFUL")
    assert workflow_of(results["book"]).state == WorkflowState.COMPENSATED
    assert effects("cancel:") == ["cancel:h4/2"]


def test_a_compensation_on_a_limited_queue_runs_under_the_queues_limit(settings):
    config = copy.deepcopy(settings.TASKS)
    config["default"]["OPTIONS"]["QUEUE_LIMITS"] = {"default": ConcurrencyLimit(1)}
    settings.TASKS = config  # the backends are made again from it
    results = saga.enqueue_stay("h3", 1, saga.cancel_room)
    drain()
    undo = compensation_of(results)
    assert (undo.limit_key, undo.status) == ("concurrency:queue:default", "SUCCESSFUL")
    assert effects("cancel:") == ["cancel:h3/1"]


@pytest.fixture
def admin_client(client):
    user = User.objects.create_superuser("admin", "admin@example.com", "pw")
    client.force_login(user)
    return client


def test_admin_shows_a_workflow_that_failed_to_compensate(admin_client):
    failing = order(7, refund=saga.refund_fails)
    fine = order(8, then=tasks.record)
    drain()
    url = reverse("admin:django_rdbtasks_workflow_changelist")
    page = admin_client.get(url).content.decode()
    assert "order 7" in page and "order 8" in page and "Failed to compensate" in page
    page = admin_client.get(url, {"state": "FAILED_TO_COMPENSATE"}).content.decode()
    assert "order 7" in page and "order 8" not in page
    workflow = workflow_of(failing["ship"])
    page = admin_client.get(
        reverse("admin:django_rdbtasks_workflow_change", args=[workflow.pk])
    ).content.decode()
    assert "Failed to compensate" in page and "undo charge" in page and "undo reserve" in page
    # Beside the dependency graph, on the page of each of its tasks.
    page = admin_client.get(
        reverse("admin:django_rdbtasks_task_change", args=[failing["charge"].id])
    ).content.decode()
    assert "Failed to compensate" in page and "order 7" in page
    page = admin_client.get(
        reverse("admin:django_rdbtasks_task_change", args=[fine["charge"].id])
    ).content.decode()
    assert "Succeeded" in page


def test_workflows_are_shown_to_those_who_see_their_tasks_queues(settings):
    from django.test import Client

    from tests.browser.support import VIEW, in_groups, staff

    settings.RDBTASKS_QUEUE_PERMISSIONS = {"emails": ["mailing"], "*": ["ops"]}
    order(9)  # on the default queue
    url = reverse("admin:django_rdbtasks_workflow_changelist")
    seen = {}
    for name in ("mailing", "ops"):
        client = Client()
        client.force_login(in_groups(staff(name, VIEW), name))
        response = client.get(url)
        assert response.status_code == 200
        seen[name] = "order 9" in response.content.decode()
    assert seen == {"mailing": False, "ops": True}


# -- real worker processes -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["optimistic", "skip-locked"])
def test_compensations_run_once_in_reverse_order_under_worker_processes(
    run_workers, vendor, mode, admin_client
):
    if vendor == "sqlite" and mode == "skip-locked":
        pytest.skip("SQLite has no SKIP LOCKED")
    count = 5
    flows = [order(100 + i) for i in range(count)]
    broken = order(199, refund=saga.refund_fails)
    workers = run_workers(
        "--processes", "3", "--mode", mode, "--burst", "--no-scheduler", "--poll-interval", "0.1"
    )
    assert workers.wait(timeout=300) == 0, workers.log()
    for i, results in enumerate(flows):
        workflow = workflow_of(results["ship"])
        assert workflow.state == WorkflowState.COMPENSATED, workflow.reason
        n = 100 + i
        # Each effect once (counted), the refund before the release (by sequence).
        assert SideEffect.objects.filter(key=f"refund:{n}").count() == 1
        assert SideEffect.objects.filter(key=f"release:{n}").count() == 1
        refund = SideEffect.objects.get(key=f"refund:{n}")
        release = SideEffect.objects.get(key=f"release:{n}")
        assert refund.id < release.id
    # The refund that fails for good: its own retries, then the workflow says so.
    workflow = workflow_of(broken["ship"])
    assert workflow.state == WorkflowState.FAILED_TO_COMPENSATE
    assert effects("refund-run:199") == ["refund-run:199"] * 2 and effects("release:199") == []
    page = admin_client.get(
        reverse("admin:django_rdbtasks_task_change", args=[broken["reserve"].id])
    ).content.decode()
    assert "Failed to compensate" in page


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["optimistic", "skip-locked"])
def test_a_compensation_whose_worker_is_sigkilled_still_runs_once(run_workers, vendor, mode):
    if vendor == "sqlite" and mode == "skip-locked":
        pytest.skip("SQLite has no SKIP LOCKED")
    results = order(200, pause_refund=True)
    workers = run_workers(
        "--mode", mode, "--lease", "1", "--poll-interval", "0.1", "--no-scheduler"
    )
    paused = wait_until(
        lambda: SideEffect.objects.filter(key="refund-paused:200").first(), timeout=120
    )
    os.kill(paused.pid, signal.SIGKILL)  # mid-compensation: it waits for "resume"
    workflow = workflow_of(results["ship"])
    wait_until(
        lambda: WorkflowRow.objects.get(pk=workflow.pk).state in WorkflowState.finished(),
        timeout=120,
    )
    workers.stop()
    workflow.refresh_from_db()
    assert workflow.state == WorkflowState.COMPENSATED, workflow.reason
    # Ran twice (killed after its refund committed, then reclaimed: the ledger
    # says it is done), refunded once; released once, after.
    assert effects("refund-run") == ["refund-run:200"] * 2
    assert effects("refund:") == ["refund:200"] and effects("release:") == ["release:200"]
    assert (
        SideEffect.objects.get(key="refund:200").id < SideEffect.objects.get(key="release:200").id
    )
    refund = workflow.steps.get(name="undo charge").task
    assert refund.attempts == 2 and [e["outcome"] for e in refund.history] == [
        "LOST",
        "ALREADY_DONE",
    ]
    assert workflow.steps.filter(role=StepRole.COMPENSATION).count() == 2


def assert_undone_in_reverse(workflow):
    """One compensation per step that succeeded, the last to finish undone first; one at a time."""
    undos = list(workflow.steps.filter(role=StepRole.COMPENSATION).select_related("task", "undoes"))
    undos.sort(key=lambda step: step.task.started_at)
    succeeded = Task.objects.filter(
        pk__in=workflow.steps.filter(role=StepRole.STEP).values("task_id"), status="SUCCESSFUL"
    )
    newest_first = sorted(succeeded, key=lambda t: (t.finished_at, t.pk), reverse=True)
    assert [step.undoes for step in undos] == newest_first
    for before, after in itertools.pairwise(undos):
        assert before.task.finished_at <= after.task.started_at


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["optimistic", "skip-locked"])
def test_fan_out_sagas_settle_under_racing_worker_processes(run_workers, vendor, mode):
    """Seats held in parallel, settled by several processes at once on one workflow row."""
    if vendor == "sqlite" and mode == "skip-locked":
        pytest.skip("SQLite has no SKIP LOCKED")
    flights, seats = 8, 6
    for flight in range(flights):
        saga.enqueue_flight(flight, seats, seconds=0.05)
    workers = run_workers(
        "--processes",
        "3",
        "--threads",
        "2",
        "--mode",
        mode,
        "--burst",
        "--no-scheduler",
        "--poll-interval",
        "0.1",
    )
    assert workers.wait(timeout=300) == 0, workers.log()
    for workflow in WorkflowRow.objects.all():
        assert workflow.state == WorkflowState.COMPENSATED, workflow.reason
        assert_undone_in_reverse(workflow)
    held = SideEffect.objects.filter(key__startswith="hold:").values_list("key", flat=True)
    freed = SideEffect.objects.filter(key__startswith="free:").values_list("key", flat=True)
    # Every seat held was freed, once; none freed that was not held.
    assert sorted(k.split(":", 1)[1] for k in freed) == sorted(k.split(":", 1)[1] for k in held)
    assert len(set(freed)) == len(freed)
