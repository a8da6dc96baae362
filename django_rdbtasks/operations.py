"""Migration operations that change the task table's indexes while it is in use.

On PostgreSQL a plain ``CREATE INDEX`` holds every write to the table until
it is done, and a plain ``DROP INDEX`` waits for every transaction that has
touched the table and holds the writes that queue behind it. These build
and drop ``CONCURRENTLY``: enqueues, claims and outcomes go on meanwhile.
Such a statement cannot run in a transaction, so a migration made of them is
not atomic (``atomic = False``); if it is interrupted, ``migrate`` again:
each build first drops what an interrupted build of its own left behind (an
INVALID index). Other databases build and drop plainly.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from .db.postgresql.schema import (
    TASK_COLUMNS_SQL,
    create_finished_table_sql,
    drop_finished_table_sql,
    drop_interrupted_index_sql,
)


def _postgresql(schema_editor: Any) -> bool:
    return bool(schema_editor.connection.vendor == "postgresql")


def build_online(schema_editor: Any, model: Any, index: Any) -> None:
    """Build ``index``; on PostgreSQL concurrently, first dropping an interrupted build's."""
    if _postgresql(schema_editor):
        schema_editor.execute(drop_interrupted_index_sql(schema_editor.quote_name(index.name)))
        schema_editor.add_index(model, index, concurrently=True)
    else:
        schema_editor.add_index(model, index)


def drop_online(schema_editor: Any, model: Any, index: Any) -> None:
    """Drop ``index``; on PostgreSQL concurrently."""
    if _postgresql(schema_editor):
        schema_editor.remove_index(model, index, concurrently=True)
    else:
        schema_editor.remove_index(model, index)


class AddIndexOnline(migrations.AddIndex):
    """``AddIndex``, built without holding writes on PostgreSQL, and re-runnable there."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            build_online(schema_editor, model, self.index)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            drop_online(schema_editor, model, self.index)


class RemoveIndexOnline(migrations.RemoveIndex):
    """``RemoveIndex``, dropped (and built back) without holding writes on PostgreSQL."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            drop_online(schema_editor, model, index)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            build_online(schema_editor, model, index)


class CreateFinishedTable(migrations.operations.base.Operation):
    """PostgreSQL: the table finished tasks move to (db/postgresql/finished.py); nothing elsewhere.

    It inherits the task table (its columns, and each later change of them),
    holds finished statuses only (``statuses``), and has the indexes the
    readers of finished rows use: primary key, ``finished_at`` (retention, the
    dashboard), the failed rows, the task path, and the admin's searches.
    Made empty: the rows finished before it stay in the task table, where
    every reader still finds them. Backwards, its rows go back to the task
    table first.
    """

    reversible = True
    reduces_to_sql = True

    def __init__(self, task_table: str, table: str, statuses: list[str]) -> None:
        self.task_table = task_table
        self.table = table
        self.statuses = statuses

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {"task_table": self.task_table, "table": self.table, "statuses": self.statuses}
        return self.__class__.__qualname__, [], kwargs

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def _applies(self, app_label: str, schema_editor: Any, state: Any) -> bool:
        """On PostgreSQL, where the router lets the task table be migrated."""
        model = state.apps.get_model(app_label, "task")
        alias = schema_editor.connection.alias
        return _postgresql(schema_editor) and bool(self.allow_migrate_model(alias, model))

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if not self._applies(app_label, schema_editor, to_state):
            return
        for statement in create_finished_table_sql(
            schema_editor.quote_name, self.task_table, self.table, self.statuses
        ):
            schema_editor.execute(statement)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if not self._applies(app_label, schema_editor, from_state):
            return
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(TASK_COLUMNS_SQL, [self.task_table])
            columns = [name for (name,) in cursor.fetchall()]
        for statement in drop_finished_table_sql(
            schema_editor.quote_name, self.task_table, self.table, columns
        ):
            schema_editor.execute(statement)

    def describe(self) -> str:
        return f"Creates {self.table}, the table finished tasks move to, on PostgreSQL"
