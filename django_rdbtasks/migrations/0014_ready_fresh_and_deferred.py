"""READY rows without a limit in two indexes: fresh ones, and those due later.

``rdbtasks_task_ready_unlimited`` held every READY row without a limit in the
claim's order (queue, priority, ``run_after``). Rows due later (scheduled by
their producer, or waiting out a retry's backoff) sort after every row due
now, so each new task was inserted in the index's middle, just before them,
where a full page is split in two rather than appended to: 8 to 10 % more WAL
a task with 100,000 tasks scheduled (docs/benchmarks.md). Now:

- ``rdbtasks_task_ready_fresh``: enqueued to run at once, never started. A
  new task sorts after the others and its entry goes at the right edge.
- ``rdbtasks_task_ready_deferred``: the others (``requested_run_after`` or
  ``started_at`` set).

The claim reads both (``db/ready_arms.py``).

- PostgreSQL: both are built with ``CREATE INDEX CONCURRENTLY``, then the old
  one is dropped concurrently: enqueues, claims and outcomes go on meanwhile,
  and the claim uses the old index until the new ones are valid. Each build
  reads the whole table twice and waits for the transactions open when it
  starts. Not atomic: if interrupted, run ``migrate`` again
  (``django_rdbtasks.operations``).
- SQLite: the same indexes, built plainly.
- MySQL and MariaDB have no partial indexes: nothing changes there (their
  ``rdbtasks_task_ready`` holds every READY row).
"""

from django.db import migrations, models

import django_rdbtasks.models.tasks
from django_rdbtasks.operations import AddIndexOnline, RemoveIndexOnline


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_rdbtasks", "0013_task_path_finished_only"),
    ]

    operations = [
        AddIndexOnline(
            model_name="task",
            index=django_rdbtasks.models.tasks.PartialIndex(
                condition=models.Q(
                    ("limit_key__isnull", True),
                    ("requested_run_after__isnull", True),
                    ("started_at__isnull", True),
                    ("status", "READY"),
                ),
                fields=["queue_name", "-priority", "run_after"],
                name="rdbtasks_task_ready_fresh",
            ),
        ),
        AddIndexOnline(
            model_name="task",
            index=django_rdbtasks.models.tasks.PartialIndex(
                condition=models.Q(
                    ("limit_key__isnull", True),
                    ("status", "READY"),
                    models.Q(
                        ("requested_run_after__isnull", False),
                        ("started_at__isnull", False),
                        _connector="OR",
                    ),
                ),
                fields=["queue_name", "-priority", "run_after"],
                name="rdbtasks_task_ready_deferred",
            ),
        ),
        RemoveIndexOnline(model_name="task", name="rdbtasks_task_ready_unlimited"),
    ]
