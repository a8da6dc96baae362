"""Requeueing in bulk (the admin's *Retry all failed…*, ``manage.py requeue``)."""

from __future__ import annotations

import pytest

from django_rdbtasks import bulk_requeue
from django_rdbtasks.compat import task_backends
from django_rdbtasks.models import Task, TaskStatus
from tests.browser.support import make_task

pytestmark = pytest.mark.django_db


def test_requeue_tasks_changes_rows_as_the_backend_does() -> None:
    """bulk_requeue.requeue_tasks mirrors RDBTaskBackend.requeue; this keeps them in step."""
    ours, theirs = make_task(TaskStatus.FAILED), make_task(TaskStatus.FAILED)
    assert bulk_requeue.requeue_tasks(Task.objects.filter(pk=ours.pk)) == 1
    assert task_backends["default"].requeue(str(theirs.pk))
    columns = [f.attname for f in Task._meta.concrete_fields]
    ignore = {"id", "run_after", "enqueued_at", "started_at", "last_attempted_at", "history"}
    ours.refresh_from_db()
    theirs.refresh_from_db()
    assert {c: getattr(ours, c) for c in columns if c not in ignore} == {
        c: getattr(theirs, c) for c in columns if c not in ignore
    }
    assert ours.status == TaskStatus.READY and ours.attempts == 0
    assert abs((ours.run_after - theirs.run_after).total_seconds()) < 5
    assert [e["outcome"] for e in ours.history] == ["RETRY", "FAILED"]  # kept, as theirs
    assert [e["outcome"] for e in theirs.history] == ["RETRY", "FAILED"]


def test_requeue_tasks_in_batches_skips_what_cannot_be_requeued() -> None:
    failed = [make_task(TaskStatus.FAILED) for _ in range(7)]
    running = make_task(TaskStatus.RUNNING)
    done = make_task(TaskStatus.SUCCESSFUL)
    batches: list[list[bulk_requeue.Requeued]] = []
    requeued = bulk_requeue.requeue_tasks(Task.objects.all(), batch_size=3, on_batch=batches.append)
    assert requeued == 7
    assert [len(b) for b in batches] == [3, 3, 1]
    assert {r.id for b in batches for r in b} == {t.pk for t in failed}
    assert all(r.was == "FAILED" for b in batches for r in b)
    assert Task.objects.get(pk=running.pk).status == TaskStatus.RUNNING
    assert Task.objects.get(pk=done.pk).status == TaskStatus.SUCCESSFUL


def test_requeue_tasks_limit() -> None:
    for _ in range(5):
        make_task(TaskStatus.FAILED)
    assert bulk_requeue.requeue_tasks(Task.objects.all(), batch_size=2, limit=3) == 3
    assert Task.objects.filter(status=TaskStatus.FAILED).count() == 2
