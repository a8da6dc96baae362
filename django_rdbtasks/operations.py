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


def _postgresql(schema_editor: Any) -> bool:
    return bool(schema_editor.connection.vendor == "postgresql")


def build_online(schema_editor: Any, model: Any, index: Any) -> None:
    """Build ``index``; on PostgreSQL concurrently, first dropping an interrupted build's."""
    if _postgresql(schema_editor):
        name = schema_editor.quote_name(index.name)
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
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
