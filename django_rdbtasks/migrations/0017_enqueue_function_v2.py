"""PostgreSQL: ``rdbtasks_enqueue_v2``, the single enqueue's function, announcing
its row on ``rdbtasks_ready``.

``v1`` (migration 0005) notifies ``rdbtasks`` with the queue's name. A worker
of this release reads each queue from its lanes' frontiers (db/frontier.py),
and a row its frontier may have passed must be announced with the priority
and the start of the transaction that wrote it: ``v2`` sends
``priority|start|queue`` on ``rdbtasks_ready`` (postgresql/channels.py), as the
release's direct INSERT and COPY do. ``v1`` stays for the previous release's
web processes during a rolling deploy; a worker that hears ``rdbtasks`` reads
from the head once, so nothing they enqueue waits.

The SQL is frozen here, as a migration's must be.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

SIGNATURE = (
    "rdbtasks_enqueue_v2(uuid, text, text, text, integer, jsonb, jsonb, integer, "
    "timestamptz, text, text, text, integer, text, jsonb, boolean)"
)

CREATE = """
CREATE OR REPLACE FUNCTION rdbtasks_enqueue_v2(
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
        -- Delivered at commit: the row's priority, its transaction's start
        -- (microseconds since the epoch, one less), its queue.
        PERFORM pg_notify(
            'rdbtasks_ready',
            p_priority::text || '|'
            || ((extract(epoch FROM transaction_timestamp()) * 1000000)::bigint - 1)::text
            || '|' || p_queue_name
        );
    END IF;
    RETURN (extract(epoch FROM enqueued) * 1000000)::bigint;
END
$rdbtasks$
"""


class CreateEnqueueFunctionV2(migrations.operations.base.Operation):
    """``CREATE FUNCTION rdbtasks_enqueue_v2`` on PostgreSQL; nothing elsewhere."""

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
        return "Creates the enqueue function v2 on PostgreSQL"


class Migration(migrations.Migration):
    dependencies = [
        ("django_rdbtasks", "0016_paused_queues"),
    ]

    operations = [CreateEnqueueFunctionV2()]
