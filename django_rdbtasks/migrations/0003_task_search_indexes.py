"""Indexes for the admin: failed tasks, search (trigram on PostgreSQL, prefix elsewhere),
and the finished index made to cover the dashboard's counts.

The dashboard proxy puts the dashboard in the admin's app list; it has no table.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

import django_rdbtasks.models


class CreateTrigramExtension(migrations.operations.base.Operation):
    """``CREATE EXTENSION pg_trgm`` on PostgreSQL; nothing on other databases.

    ``django.contrib.postgres``'s ``TrigramExtension`` would do the same, but
    importing it needs psycopg, which a MySQL or SQLite project may not have.
    pg_trgm is a trusted extension (PostgreSQL 13+): the database's owner may
    create it without being a superuser. It is left in place on the way back,
    since other apps may use it.
    """

    reversible = True
    reduces_to_sql = True

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        pass

    def describe(self) -> str:
        return "Creates the pg_trgm extension on PostgreSQL"


class Migration(migrations.Migration):
    dependencies = [
        ("django_rdbtasks", "0002_task_requested_run_after_job_declarations"),
    ]

    operations = [
        CreateTrigramExtension(),
        migrations.CreateModel(
            name="Dashboard",
            fields=[],
            options={
                "verbose_name": "dashboard",
                "verbose_name_plural": "dashboard",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("django_rdbtasks.task",),
        ),
        # The dashboard's counts by time, status and queue read this index alone.
        migrations.RemoveIndex(model_name="task", name="rdbtasks_task_finished"),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                fields=["finished_at", "status", "queue_name"], name="rdbtasks_task_finished"
            ),
        ),
        migrations.AddIndex(
            model_name="task",
            index=django_rdbtasks.models.StatusIndex(
                condition=models.Q(("status", "FAILED")), fields=["id"], name="rdbtasks_task_failed"
            ),
        ),
        migrations.AddIndex(
            model_name="task",
            index=django_rdbtasks.models.SearchIndex(
                fields=["task_path"], name="rdbtasks_task_path_search"
            ),
        ),
        migrations.AddIndex(
            model_name="task",
            index=django_rdbtasks.models.SearchIndex(
                condition=models.Q(("job_name", ""), _negated=True),
                fields=["job_name"],
                name="rdbtasks_task_job_search",
            ),
        ),
        migrations.AddIndex(
            model_name="task",
            index=django_rdbtasks.models.SearchIndex(
                condition=models.Q(("dedup_key__isnull", False)),
                fields=["dedup_key"],
                name="rdbtasks_task_dedup_search",
            ),
        ),
    ]
