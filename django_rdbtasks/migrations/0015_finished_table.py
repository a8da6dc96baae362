"""Finished tasks in a table of their own on PostgreSQL (db/pg_finished.py).

- PostgreSQL: ``django_rdbtasks_finishedtask`` is made, inheriting the task
  table, empty. Workers of this version move each task they finish there;
  rows finished before stay where they are, and every reader reads both.
- Every database: the foreign keys to the task table lose their database
  constraint (a constraint would not follow a row that moves). Django still
  cascades deletions, and retention deletes these rows with their tasks.
  On PostgreSQL dropping a constraint takes an ACCESS EXCLUSIVE lock on the
  task table until the migration commits (reads and writes wait), and
  waits for the transactions open on it.
- Backwards, the finished rows go back to the task table, then the
  constraints come back.

Upgrade: migrate, then restart the workers. A worker of this version started
before the migration finishes rows in place until it restarts; one of an
earlier version keeps doing so. Either way nothing is lost or hidden. To go
back below 0015, stop the workers first.
"""

import django.db.models.deletion
from django.db import migrations, models

from django_rdbtasks.operations import CreateFinishedTable


class Migration(migrations.Migration):
    dependencies = [
        ("django_rdbtasks", "0014_ready_fresh_and_deferred"),
    ]

    operations = [
        migrations.AlterField(
            model_name="taskdependency",
            name="parent",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="django_rdbtasks.task",
            ),
        ),
        migrations.AlterField(
            model_name="taskdependency",
            name="child",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="django_rdbtasks.task",
            ),
        ),
        migrations.AlterField(
            model_name="jobrecord",
            name="task",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="job_records",
                to="django_rdbtasks.task",
            ),
        ),
        migrations.AlterField(
            model_name="workflowstep",
            name="task",
            field=models.OneToOneField(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                primary_key=True,
                related_name="workflow_step",
                serialize=False,
                to="django_rdbtasks.task",
            ),
        ),
        migrations.AlterField(
            model_name="workflowstep",
            name="undoes",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="django_rdbtasks.task",
            ),
        ),
        CreateFinishedTable(
            task_table="django_rdbtasks_task",
            table="django_rdbtasks_finishedtask",
            statuses=["SUCCESSFUL", "FAILED", "CANCELLED"],
        ),
    ]
