"""PostgreSQL's statements of the app's migrations (``operations.py`` runs them).

An index built or dropped ``CONCURRENTLY`` (enqueues, claims and outcomes go
on meanwhile), and the table of finished rows (``finished.py``): made with
``INHERITS``, holding finished statuses only, with the indexes its readers
use; and, backwards, its rows moved back to the task table before it goes.
Names come quoted, by the caller's schema editor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

#: The indexes of the finished rows' table, by the suffix of their names:
#: primary key aside, ``finished_at`` (retention, the dashboard), the failed
#: rows, the task path, and the admin's searches.
FINISHED_INDEXES = {
    "finished": "(finished_at, status, queue_name)",
    "failed": "(id) WHERE status = 'FAILED'",
    "path": "(task_path)",
    "job_search": "USING gin (job_name gin_trgm_ops) WHERE job_name <> ''",
    "dedup_search": "USING gin (dedup_key gin_trgm_ops) WHERE dedup_key IS NOT NULL",
}
#: The task table's columns a row is copied by, in order (parameter: the table's
#: name), the generated ones left out: the table computes them again.
TASK_COLUMNS_SQL = (
    "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
    "AND table_schema = current_schema() AND is_generated = 'NEVER' "
    "ORDER BY ordinal_position"
)


def drop_interrupted_index_sql(name: str) -> str:
    """What an interrupted concurrent build of index ``name`` left (an INVALID index), dropped."""
    return f"DROP INDEX CONCURRENTLY IF EXISTS {name}"


def create_finished_table_sql(
    quote: Callable[[str], str], task_table: str, table: str, statuses: Sequence[str]
) -> list[str]:
    """The finished rows' table ``table`` (unquoted), inheriting ``task_table``, and its indexes."""
    name = table.removeprefix("django_")
    finished = ", ".join(f"'{status}'" for status in statuses)
    return [
        f"CREATE TABLE {quote(table)} (CONSTRAINT {quote(name + '_pkey')} PRIMARY KEY (id), "
        f"CONSTRAINT {quote(name + '_status')} CHECK (status IN ({finished}))) "
        f"INHERITS ({quote(task_table)})",
        *(
            f"CREATE INDEX {quote(f'{name}_{suffix}')} ON {quote(table)} {shape}"
            for suffix, shape in FINISHED_INDEXES.items()
        ),
    ]


def drop_finished_table_sql(
    quote: Callable[[str], str], task_table: str, table: str, columns: Sequence[str]
) -> list[str]:
    """The finished rows back in ``task_table`` (by ``columns``, unquoted); ``table`` dropped."""
    listed = ", ".join(quote(column) for column in columns)
    return [
        f"INSERT INTO {quote(task_table)} ({listed}) SELECT {listed} FROM ONLY {quote(table)}",
        f"DROP TABLE {quote(table)}",
    ]
