"""Whether a database has the migrations applied that the code expects.

Asked by ``rdbtasks probe ready`` (every app) and by ``runworkers`` before it
starts its processes (this app's), so that a worker started before
``migrate`` says what to do instead of retrying against missing tables.
"""

from __future__ import annotations

from django.db import connections

APP_LABEL = "django_rdbtasks"
FIRST_MIGRATION = "0001_initial"


def unapplied_migrations(using: str, app_label: str | None = None) -> list[str]:
    """``app.name`` of each migration the code has and ``using`` has not applied, in order.

    Only ``app_label``'s when given. Raises ``DatabaseError`` when the
    database does not answer.
    """
    from django.db.migrations.executor import MigrationExecutor

    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    loader = MigrationExecutor(connection).loader
    # Every migration the leaves need, not ``migration_plan(leaves)``: that plan
    # is empty once a leaf is recorded, even with a gap behind it.
    needed: dict[tuple[str, str], None] = {}
    for leaf in loader.graph.leaf_nodes():
        needed.update(dict.fromkeys(loader.graph.forwards_plan(leaf)))
    return [
        f"{app}.{name}"
        for app, name in needed
        if (app, name) not in loader.applied_migrations and app_label in (None, app)
    ]


def what_to_do(missing: list[str]) -> str:
    """The line that tells an operator what the unapplied migrations of this app mean."""
    if f"{APP_LABEL}.{FIRST_MIGRATION}" in missing:
        return "the task tables are missing: run manage.py migrate"
    shown = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
    return (
        f"{len(missing)} migrations of the task tables are not applied ({shown}): "
        "run manage.py migrate"
    )


#: PostgreSQL's undefined_table, MySQL/MariaDB's ER_NO_SUCH_TABLE.
UNDEFINED_TABLE_SQLSTATE = "42P01"
MYSQL_NO_SUCH_TABLE = 1146
#: How often a process waiting for ``migrate`` says so again.
REMIND_EVERY = 30.0


def tables_missing(exc: BaseException) -> bool:
    """Whether a database error says that a table does not exist."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        args = getattr(error, "args", ())
        if args and args[0] == MYSQL_NO_SUCH_TABLE:
            return True
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if state == UNDEFINED_TABLE_SQLSTATE or "no such table" in str(error):
            return True
        error = error.__cause__
    return False


class Reminder:
    """Say something now, then again at most every ``every`` seconds while it lasts."""

    def __init__(self, every: float = REMIND_EVERY) -> None:
        self.every = every
        self.said_at: float | None = None

    def due(self, now: float) -> bool:
        if self.said_at is None or now - self.said_at >= self.every:
            self.said_at = now
            return True
        return False
