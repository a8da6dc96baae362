"""The task path's search index becomes a B-tree on every database.

The trigram GIN index that PostgreSQL had on ``task_path`` took a key per
trigram of the path (about twenty) for every new row and every new version of
a row (a claim, a completion): about half the write-ahead log of an enqueue
and a tenth of its server time. The admin now finds the distinct paths that
contain a search term with a walk of this B-tree
(``TaskQuerySet.task_paths``) and then the rows of those paths, which also
gives MySQL, MariaDB and SQLite search by any part of a path.

MySQL, MariaDB and SQLite had a B-tree already: it is renamed. On PostgreSQL
the B-tree is built before the trigram index is dropped, so that the table is
closed to writes while it builds but to reads only for the drop. On a large
table, build it beforehand without closing the table at all (``CREATE INDEX
CONCURRENTLY rdbtasks_task_path ON django_rdbtasks_task (task_path)``): the
migration then finds it and only drops the old one (an invalid index, left by
a build that failed, is dropped and built again).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

import django_rdbtasks.models

OLD = django_rdbtasks.models.SearchIndex(fields=["task_path"], name="rdbtasks_task_path_search")
NEW = models.Index(fields=["task_path"], name="rdbtasks_task_path")


def _valid_index(schema_editor: Any, name: str) -> bool | None:
    """PostgreSQL: None if there is no such index, else whether it is valid."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [name])
        row = cursor.fetchone()
    return None if row is None else bool(row[0])


class ReplaceTaskPathIndex(migrations.operations.base.Operation):
    """The trigram index on ``task_path`` replaced by a B-tree (the state: see below)."""

    reversible = True

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, "task")
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor != "postgresql":
            schema_editor.rename_index(model, OLD, NEW)
            return
        valid = _valid_index(schema_editor, NEW.name)
        if valid is False:
            schema_editor.remove_index(model, NEW)
        if not valid:
            schema_editor.add_index(model, NEW)
        schema_editor.remove_index(model, OLD)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, "task")
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor != "postgresql":
            schema_editor.rename_index(model, NEW, OLD)
            return
        schema_editor.add_index(model, OLD)
        schema_editor.remove_index(model, NEW)

    def describe(self) -> str:
        return "Replaces the trigram index on Task.task_path by a B-tree"


class Migration(migrations.Migration):
    dependencies = [
        ("django_rdbtasks", "0005_enqueue_function"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[ReplaceTaskPathIndex()],
            state_operations=[
                migrations.RemoveIndex(model_name="task", name=OLD.name),
                migrations.AddIndex(model_name="task", index=NEW),
            ],
        ),
    ]
