"""The ``finished_at`` index without entries for rows that have not finished.

Every read of ``rdbtasks_task_finished`` names a time (the dashboard's
buckets, retention, requeue by age), so a row whose ``finished_at`` is NULL
was never found through it; yet the enqueue and the claim of each task (two
UPDATEs and an INSERT that cannot be HOT) each added an entry for that NULL.
On PostgreSQL (and SQLite) it is now partial, ``WHERE finished_at IS NOT
NULL``: a task adds one entry here, when it finishes. The admin's "finished:
not yet" filter reads the READY, RUNNING and WAITING indexes instead
(``TaskQuerySet.unfinished``). MySQL and MariaDB have no partial indexes:
there the index is dropped and made again as it was.

PostgreSQL builds the new index reading the whole table, with writes to it
held meanwhile (a second or two per million rows).
"""

from django.db import migrations, models

import django_rdbtasks.models.tasks


class Migration(migrations.Migration):
    dependencies = [
        ("django_rdbtasks", "0011_one_active_partial"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="task",
            name="rdbtasks_task_finished",
        ),
        migrations.AddIndex(
            model_name="task",
            index=django_rdbtasks.models.tasks.PartialWherePossibleIndex(
                condition=models.Q(finished_at__isnull=False),
                fields=["finished_at", "status", "queue_name"],
                name="rdbtasks_task_finished",
            ),
        ),
    ]
