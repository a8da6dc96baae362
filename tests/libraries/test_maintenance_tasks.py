"""django-maintenance-tasks on this backend: a backfill in batches, each batch a task
that enqueues the next from inside the worker (``transaction.on_commit``).

The library needs Django 6.0+ and Python 3.12+: the Django 6.1 line only.
"""

from io import StringIO

import pytest
from django.core.management import call_command

from django_rdbtasks.compat import HAS_DJANGO_TASKS
from django_rdbtasks.models import Task
from django_rdbtasks.worker import Worker

pytestmark = [
    pytest.mark.skipif(
        not HAS_DJANGO_TASKS,
        reason="django-maintenance-tasks needs Django 6.0+ (the 6.1 line here)",
    ),
    # Every test here puts back what the migrations made (see test_wagtail.py).
    pytest.mark.django_db(transaction=True, serialized_rollback=True),
]

BACKFILL = "tests.libraries.backfill.maintenance_tasks.Backfill"


def test_a_backfill_started_by_its_command_runs_batch_by_batch():
    from maintenance_tasks.models import Run

    from tests.libraries.backfill.maintenance_tasks import WORDS
    from tests.testapp.models import SideEffect

    call_command("maintenance_tasks", "run", BACKFILL, stdout=StringIO())
    assert list(Task.objects.values_list("task_path", flat=True)) == [
        "maintenance_tasks.runner.run_batch"
    ]
    Worker(burst=True).run(install_signals=False)
    run = Run.objects.get()
    assert (run.status, run.tick_count, run.tick_total) == ("succeeded", 7, 7)
    # Three batches of three words at most, each its own task, each run once.
    batches = Task.objects.filter(task_path="maintenance_tasks.runner.run_batch")
    assert sorted(batches.values_list("status", flat=True)) == ["SUCCESSFUL"] * 3
    effects = SideEffect.objects.filter(key__startswith="backfill-")
    assert sorted(effects.values_list("key", flat=True)) == sorted(f"backfill-{w}" for w in WORDS)
