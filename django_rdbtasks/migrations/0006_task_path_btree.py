"""The task path's search index becomes a B-tree on every database.

The trigram GIN index that PostgreSQL had on ``task_path`` took a key per
trigram of the path (about twenty) for every new row and every new version of
a row (a claim, a completion): about half the write-ahead log of an enqueue
and a tenth of its server time. The admin now finds the distinct paths that
contain a search term with a walk of this B-tree
(``TaskQuerySet.task_paths``) and then the rows of those paths, which also
gives MySQL, MariaDB and SQLite search by any part of a path.

Building the index on a large table blocks writes to it while it builds; on
PostgreSQL, ``CREATE INDEX CONCURRENTLY rdbtasks_task_path ON
django_rdbtasks_task (task_path)`` run by hand beforehand avoids that (the
migration then only drops the old index: see the CHANGELOG).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


class AddIndexIfMissing(migrations.AddIndex):
    """``AddIndex``, skipped on PostgreSQL where the index was built beforehand by hand."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            with schema_editor.connection.cursor() as cursor:
                cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [self.index.name])
                if cursor.fetchone()[0]:
                    return
        super().database_forwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    dependencies = [
        ("django_rdbtasks", "0005_enqueue_function"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="task", name="rdbtasks_task_path_search"),
        AddIndexIfMissing(
            model_name="task",
            index=models.Index(fields=["task_path"], name="rdbtasks_task_path"),
        ),
    ]
