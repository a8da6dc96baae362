"""PostgreSQL: retention's batch, what hangs off its tasks and the tasks, in one statement.

``retention.py`` decides which tasks are prunable and what refers to them (the
relations and their ``on_delete``); this module writes the statement. The
batch is read oldest first through the ``finished_at`` index, its rows locked
and skipped if someone holds them; each table that refers to the tasks has its
rows deleted (``CASCADE``) or unlinked (``SET_NULL``); then the tasks go. The
foreign keys are checked at commit (Django creates them deferred), when every
row of the statement is gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Link:
    """A column of another table that refers to the tasks, its names quoted."""

    table: str
    column: str
    #: Its rows are deleted with their task (``CASCADE``); else unlinked (``SET_NULL``).
    cascade: bool
    #: Unlinked only: columns of the same table through which the statement
    #: deletes rows (one statement changes a row once: a row it deletes is
    #: not updated too).
    deleted_through: tuple[str, ...] = ()


def delete_batch_sql(table: str, key: str, links: Sequence[Link]) -> str:
    """The statement, for the task table ``table`` (quoted) and its primary key ``key``.

    Parameters: the statuses (an array), the cutoff and the batch size, twice
    (the candidates counted, the batch read). Rows: a status and how many of
    its tasks were deleted, and one row without a status, the candidates
    counted (the rows held by others included).
    """
    batch = "(SELECT id FROM batch)"
    parts = [
        "candidates AS MATERIALIZED (SELECT count(*) AS n FROM (SELECT 1 FROM "
        f"{table} WHERE status = ANY(%s) AND finished_at < %s LIMIT %s) AS c)",
        f"batch AS MATERIALIZED (SELECT {key} AS id FROM {table} WHERE status = ANY(%s)"
        " AND finished_at < %s ORDER BY finished_at LIMIT %s FOR UPDATE SKIP LOCKED)",
    ]
    for i, link in enumerate(links):
        if link.cascade:
            parts.append(f"r{i} AS (DELETE FROM {link.table} WHERE {link.column} IN {batch})")
        else:
            going = "".join(f" AND {column} NOT IN {batch}" for column in link.deleted_through)
            parts.append(
                f"r{i} AS (UPDATE {link.table} SET {link.column} = NULL "
                f"WHERE {link.column} IN {batch}{going})"
            )
    parts.append(f"gone AS (DELETE FROM {table} WHERE {key} IN {batch} RETURNING status)")
    return (
        f"WITH {', '.join(parts)} SELECT status, count(*) FROM gone GROUP BY status"
        " UNION ALL SELECT NULL, n FROM candidates"
    )
