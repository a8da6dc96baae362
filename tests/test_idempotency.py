"""once(): one effect per key, even under concurrency; dedup enqueue: one active task per key."""

import threading
import time

import pytest
from django.db import connection, connections, transaction

from django_rdbtasks.idempotency import AlreadyDone, once
from django_rdbtasks.models import JobRecord, Task
from django_rdbtasks.worker import Worker
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def test_once_records_and_refuses_a_second_run():
    with once("daily-report", key="2026-11-22") as record:
        SideEffect.objects.create(key="report")
    assert record.pk is not None
    with pytest.raises(AlreadyDone), once("daily-report", key="2026-11-22"):
        SideEffect.objects.create(key="report")  # never runs
    assert SideEffect.objects.count() == 1
    record = JobRecord.objects.get()
    assert (record.status, record.key) == ("SUCCESSFUL", "2026-11-22")
    assert record.finished_at is not None and record.duration is not None


def test_a_failing_run_frees_the_key():
    with pytest.raises(RuntimeError), once("payment", key="order-1"):
        SideEffect.objects.create(key="charged")
        raise RuntimeError("card declined")
    assert not JobRecord.objects.exists() and not SideEffect.objects.exists()
    with once("payment", key="order-1"):
        SideEffect.objects.create(key="charged")
    assert SideEffect.objects.count() == 1


def test_once_joins_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        with once("payment", key="order-2"):
            SideEffect.objects.create(key="charged")
        raise RuntimeError("the outer transaction fails after the block")
    assert not JobRecord.objects.exists() and not SideEffect.objects.exists()


def test_concurrent_runs_of_one_key_have_one_effect(vendor):
    outcomes = []
    barrier = threading.Barrier(4)

    def run():
        barrier.wait()
        try:
            with once("concurrent", key="k"):
                SideEffect.objects.create(key="effect")
                time.sleep(0.3)  # hold the key while the others try
            outcomes.append("done")
        except AlreadyDone:
            outcomes.append("already")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["already"] * 3 + ["done"]
    assert SideEffect.objects.count() == 1


def test_task_option_once_key():
    first = tasks.charge_order.enqueue(7, 100)
    second = tasks.charge_order.enqueue(7, 100)
    other = tasks.charge_order.enqueue(8, 50)
    Worker(burst=True).run(install_signals=False)
    assert SideEffect.objects.filter(key="charge:7").count() == 1
    assert SideEffect.objects.filter(key="charge:8").count() == 1
    rows = {str(t.id): t for t in Task.objects.all()}
    assert {t.status for t in rows.values()} == {"SUCCESSFUL"}  # a duplicate is not a failure
    outcomes = sorted(rows[r.id].history[-1]["outcome"] for r in (first, second))
    assert outcomes == ["ALREADY_DONE", "SUCCESSFUL"]
    record = JobRecord.objects.get(job_name="tests.testapp.tasks.charge_order", key="order:7")
    assert str(record.task_id) in {first.id, second.id} and record.status == "SUCCESSFUL"
    assert rows[other.id].return_value == 50


def test_dedup_key_keeps_one_active_task():
    first = tasks.sync_account.enqueue("acme")
    again = tasks.sync_account.enqueue(account="acme")
    other = tasks.sync_account.enqueue("globex")
    assert again.id == first.id and other.id != first.id
    assert Task.objects.count() == 2
    Worker(burst=True).run(install_signals=False)
    later = tasks.sync_account.enqueue("acme")  # the first finished: a new one may start
    assert later.id != first.id
    assert Task.objects.filter(dedup_key="sync:acme").count() == 2


def test_dedup_under_concurrent_producers(vendor):
    ids = []
    barrier = threading.Barrier(8)

    def produce():
        barrier.wait()
        try:
            ids.append(tasks.sync_account.enqueue("race").id)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=produce) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 8 and len(set(ids)) == 1
    assert Task.objects.filter(active_dedup_key="sync:race").count() == 1
    assert connection.vendor == vendor
