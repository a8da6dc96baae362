"""READY rows indexed apart by limit: a full key's backlog is never walked (issue 21).

The claim reads READY rows without a limit from one index and rows with a
limit from two others (in the claim's order, and key by key), so a full
key's backlog no longer lies in the way of anything (docs/limits.md, "Cost").

- PostgreSQL: three partial indexes (READY rows without a limit, READY rows
  with one, the same by key), then the old READY index is dropped. Each is
  built with ``CREATE INDEX CONCURRENTLY``: enqueues, claims and outcomes go
  on meanwhile (a plain ``CREATE INDEX`` would hold every write to the table
  until it is done). Each build reads the whole table twice and waits for
  the transactions open when it starts; the indexes themselves hold READY
  rows only. That is why this migration is not atomic: if it is interrupted,
  run ``migrate`` again; each step first drops what an interrupted build of
  its own left behind (an INVALID index).
- MySQL and MariaDB have no partial indexes: one index is added,
  ``(status, queue_name, limit_key, priority, run_after)`` over every row,
  which InnoDB builds online (writes go on; the table is read once). The old
  READY index stays: there it still serves the reads in the claim's order.
  Every row pays for the one index more.
- SQLite: the same indexes as PostgreSQL, built plainly (the database is
  locked while they build).
"""

from django.db import migrations, models

import django_rdbtasks.models
from django_rdbtasks.operations import AddIndexOnline


#: The READY index as migration 0001 made it.
OLD_READY = django_rdbtasks.models.StatusIndex(
    condition=models.Q(("status", "READY")),
    fields=["queue_name", "-priority", "run_after"],
    name="rdbtasks_task_ready",
)


class DropOldReadyIndex(migrations.operations.base.Operation):
    """Drop the READY index where partial indexes replace it; MySQL keeps it."""

    reduces_to_sql = False
    reversible = True

    def state_forwards(self, app_label, state):
        pass  # the state's change is the SeparateDatabaseAndState's

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        connection = schema_editor.connection
        if not connection.features.supports_partial_indexes:
            return
        name = schema_editor.quote_name(OLD_READY.name)
        concurrently = " CONCURRENTLY" if connection.vendor == "postgresql" else ""
        schema_editor.execute(f"DROP INDEX{concurrently} IF EXISTS {name}")

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if not schema_editor.connection.features.supports_partial_indexes:
            return
        AddIndexOnline("task", OLD_READY).database_forwards(
            app_label, schema_editor, to_state, from_state
        )

    def describe(self):
        return "Drop the old READY index where partial indexes replace it"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_rdbtasks", "0009_workflows"),
    ]

    operations = [
        AddIndexOnline(
            model_name="task",
            index=django_rdbtasks.models.PartialIndex(
                condition=models.Q(("limit_key__isnull", True), ("status", "READY")),
                fields=["queue_name", "-priority", "run_after"],
                name="rdbtasks_task_ready_unlimited",
            ),
        ),
        AddIndexOnline(
            model_name="task",
            index=django_rdbtasks.models.PartialIndex(
                condition=models.Q(("limit_key__isnull", False), ("status", "READY")),
                fields=["queue_name", "-priority", "run_after"],
                name="rdbtasks_task_ready_limited",
            ),
        ),
        AddIndexOnline(
            model_name="task",
            index=django_rdbtasks.models.StatusIndex(
                condition=models.Q(("limit_key__isnull", False), ("status", "READY")),
                fields=["queue_name", "limit_key", "-priority", "run_after"],
                name="rdbtasks_task_ready_key",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="task", name="rdbtasks_task_ready"),
                migrations.AddIndex(
                    model_name="task",
                    index=django_rdbtasks.models.WherePartialMissingIndex(
                        condition=models.Q(("status", "READY")),
                        fields=["queue_name", "-priority", "run_after"],
                        name="rdbtasks_task_ready",
                    ),
                ),
            ],
            database_operations=[DropOldReadyIndex()],
        ),
    ]
