"""Rows of the task table made by the server itself, for the tests that need many.

20,000 rows through ``bulk_create`` took 10 to 20 seconds a test (the ORM's
statement of 700,000 parameters, split and parsed on both sides); one
``INSERT ... SELECT`` over a series takes a fraction of a second on each
database.
"""

from __future__ import annotations

from django.db import connection

from django_rdbtasks.models import Task
from django_rdbtasks.states import TaskStatus

TABLE = Task._meta.db_table


def insert_rows(
    count: int,
    status: TaskStatus,
    queue: str = "default",
    limit_key: str | None = None,
    *,
    scheduled: bool = False,
    retried: bool = False,
    task_path: str = "tests.testapp.tasks.noop",
) -> None:
    """``count`` rows of ``status`` in one statement, made by the server itself.

    RUNNING rows are a dead holder's: their leases ran out a second ago.
    ``limit_key``: the rows are under a concurrency limit of 3 of that key.
    ``scheduled`` (PostgreSQL): due within the next two hours, each at its own
    time (as deferred tasks are: equal keys would be deduplicated into a few
    index pages), at priority 10, as their producer asked (``requested_run_after``);
    with ``retried``, waiting out a retry's backoff instead (``started_at``).
    Finished rows finished now.
    """
    done = status in TaskStatus.finished()
    finished = "CURRENT_TIMESTAMP" if done else "NULL"
    if connection.vendor == "postgresql":
        source = "generate_series(1, %s)"
        new_id, now = "gen_random_uuid()", "STATEMENT_TIMESTAMP() - INTERVAL '1 second'"
        if scheduled:
            now = "STATEMENT_TIMESTAMP() + INTERVAL '1 hour' + random() * INTERVAL '1 hour'"
    elif connection.vendor == "mysql":
        source = "seq_1_to_%s"  # MariaDB's sequence engine
        new_id, now = "UUID()", "UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"
        finished = "UTC_TIMESTAMP(6)" if done else "NULL"
    else:
        source = (
            "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %s) "
            "SELECT i FROM n)"
        )
        new_id = "lower(hex(randomblob(16)))"
        now = "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', '-1 seconds')"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (id, task_path, queue_name, backend_name, priority, args, "
            "kwargs, max_attempts, run_after, enqueued_at, status, version, worker_id, "
            "attempts, history, job_name, has_children, cancel_requested, progress_message, "
            "finished_at, lease_expires_at, limit_key, limit_count, limit_period, "
            "requested_run_after, started_at) "
            f"SELECT {new_id}, %s, %s, "
            f"'default', {10 if scheduled else 0}, '[]', '{{}}', 1, {now}, {now}, %s, 0, %s, 0, "
            "'[]', '', FALSE, FALSE, "
            f"'', {finished}, {now if status == TaskStatus.RUNNING else 'NULL'}, %s, %s, %s, "
            f"{now if scheduled and not retried else 'NULL'}, "
            f"{now if retried or status != TaskStatus.READY else 'NULL'} "
            f"FROM {source} s",
            [
                task_path,
                queue,
                status.value,
                "dead" if status == TaskStatus.RUNNING else "",
                limit_key,
                None if limit_key is None else 3,
                None if limit_key is None else 0.0,
                count,
            ],
        )


def analyze() -> None:
    """Fresh planner statistics for the task table."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"ANALYZE {TABLE}")
        elif connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {TABLE}")
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE")
