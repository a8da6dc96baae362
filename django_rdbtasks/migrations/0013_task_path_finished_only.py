"""The task path's index without entries for rows that have not finished.

On PostgreSQL no write of a task is a HOT update (each changes ``status``,
which indexes name), so every index of the table took an entry for each of a
task's three writes, the path's index included: the enqueue, the claim and
the outcome. Only the admin reads that index (its search and its filter by
task, ``requeue --task``). It now holds finished rows only (``WHERE status
IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')``): a task adds one entry, when it
finishes, and the few unfinished rows of a path are read off the READY,
RUNNING and WAITING indexes (``models.task_path_in``). SQLite has partial
indexes too and gets the same.

MySQL and MariaDB have none. There InnoDB updates a secondary index only when
its key changes, so the index over every row costs nothing on a claim; it is
only renamed.

PostgreSQL builds the new index before it drops the old one, reading the
whole table with writes held meanwhile (a second or two per million rows).
On a large table, build it beforehand without holding writes::

    CREATE INDEX CONCURRENTLY rdbtasks_task_finished_path ON django_rdbtasks_task
    (task_path) WHERE status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED');

The migration then finds it and only drops the old one (an invalid index,
left by a build that failed, or one without the condition, is dropped and
built again). Migrating back builds the index over every row the same way,
with writes held.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

import django_rdbtasks.models.tasks

OLD = models.Index(fields=["task_path"], name="rdbtasks_task_path")
NEW = django_rdbtasks.models.tasks.PartialWherePossibleIndex(
    condition=models.Q(("status__in", ["SUCCESSFUL", "FAILED", "CANCELLED"])),
    fields=["task_path"],
    name="rdbtasks_task_finished_path",
)


def _usable_index(schema_editor: Any, name: str) -> bool | None:
    """PostgreSQL: None if there is no such index, else whether it is valid and partial."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indisvalid AND indpred IS NOT NULL FROM pg_index "
            "WHERE indexrelid = to_regclass(%s)",
            [name],
        )
        row = cursor.fetchone()
    return None if row is None else bool(row[0])


class FinishedOnlyTaskPathIndex(migrations.operations.base.Operation):
    """``rdbtasks_task_path`` replaced by ``rdbtasks_task_finished_path`` (the state: below)."""

    reversible = True

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, "task")
        connection = schema_editor.connection
        if not self.allow_migrate_model(connection.alias, model):
            return
        if not connection.features.supports_partial_indexes:
            schema_editor.rename_index(model, OLD, NEW)
            return
        usable = (
            _usable_index(schema_editor, NEW.name) if connection.vendor == "postgresql" else None
        )
        if usable is False:
            schema_editor.remove_index(model, NEW)
        if not usable:
            schema_editor.add_index(model, NEW)
        schema_editor.remove_index(model, OLD)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, "task")
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if not schema_editor.connection.features.supports_partial_indexes:
            schema_editor.rename_index(model, NEW, OLD)
            return
        schema_editor.add_index(model, OLD)
        schema_editor.remove_index(model, NEW)

    def describe(self) -> str:
        return "Keeps only finished rows in the index on Task.task_path"


class Migration(migrations.Migration):
    dependencies = [
        ("django_rdbtasks", "0012_finished_index_partial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[FinishedOnlyTaskPathIndex()],
            state_operations=[
                migrations.RemoveIndex(model_name="task", name=OLD.name),
                migrations.AddIndex(model_name="task", index=NEW),
            ],
        ),
    ]
