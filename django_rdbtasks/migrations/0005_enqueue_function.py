"""PostgreSQL: one enqueue as a call of ``rdbtasks_enqueue_v1``, a PL/pgSQL function.

PL/pgSQL keeps the plan of the INSERT it runs for the life of the session, so a
single enqueue no longer pays for parsing, analysing and planning a 21-column
INSERT on every call (about a sixth of its time, measured). A prepared
statement would do the same but lives in the session, which a transaction
pooler hands to other clients; a function is a schema object and works behind
any pooler.

The SQL is frozen here, as a migration's must be: a change to the enqueue's
columns is a new function (``_v2``) in a new migration, so that the previous
release's web processes keep calling theirs during a rolling deploy. Nothing is
created on MySQL, MariaDB or SQLite; the backend inserts there directly, and on
PostgreSQL too when the function is missing (a test database made without
migrations).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

SIGNATURE = (
    "rdbtasks_enqueue_v1(uuid, text, text, text, integer, jsonb, jsonb, integer, "
    "timestamptz, text, text, text, integer, text, jsonb, boolean)"
)

CREATE = """
CREATE OR REPLACE FUNCTION rdbtasks_enqueue_v1(
    p_id uuid, p_task_path text, p_queue_name text, p_backend_name text,
    p_priority integer, p_args jsonb, p_kwargs jsonb, p_max_attempts integer,
    p_run_after timestamptz, p_status text, p_job_name text, p_dedup_key text,
    p_waiting_on integer, p_on_parent_failure text, p_trace_context jsonb,
    p_notify boolean
) RETURNS bigint
LANGUAGE plpgsql
AS $rdbtasks$
DECLARE
    enqueued timestamptz := statement_timestamp();
BEGIN
    INSERT INTO django_rdbtasks_task (
        id, task_path, queue_name, backend_name, priority, args, kwargs,
        max_attempts, run_after, enqueued_at, status, version, worker_id,
        attempts, history, job_name, dedup_key, waiting_on, on_parent_failure,
        requested_run_after, trace_context
    ) VALUES (
        p_id, p_task_path, p_queue_name, p_backend_name, p_priority, p_args,
        p_kwargs, p_max_attempts, COALESCE(p_run_after, enqueued), enqueued,
        p_status, 0, '', 0, '[]'::jsonb, p_job_name, p_dedup_key, p_waiting_on,
        p_on_parent_failure, p_run_after, p_trace_context
    );
    IF p_notify THEN
        -- Delivered at commit, like the NOTIFY of a bulk enqueue.
        PERFORM pg_notify('rdbtasks', p_queue_name);
    END IF;
    -- Microseconds since the epoch: exact, and far cheaper for the client to
    -- read than a timestamptz's text.
    RETURN (extract(epoch FROM enqueued) * 1000000)::bigint;
END
$rdbtasks$
"""


class CreateEnqueueFunction(migrations.operations.base.Operation):
    """``CREATE FUNCTION rdbtasks_enqueue_v1`` on PostgreSQL; nothing elsewhere."""

    reversible = True
    reduces_to_sql = True

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(CREATE)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")

    def describe(self) -> str:
        return "Creates the enqueue function on PostgreSQL"


class Migration(migrations.Migration):
    dependencies = [
        ("django_rdbtasks", "0004_task_trace_context"),
    ]

    operations = [CreateEnqueueFunction()]
