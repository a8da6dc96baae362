"""What metrics cost a worker per task, in CPU time, without a database.

The drain benchmark (``run.py``, variant ``metrics=--metrics-port 0``) gives
the end-to-end answer, but on a busy machine its runs move by more than the
cost being measured. This measures the cost itself: the worker's ``Reporter``
handling rounds of finished no-op tasks (100 per round, as claimed ahead)
with metrics off and on (prometheus_client's multiprocess mode, as under
``runworkers --metrics-port``), plus the ``task_started`` receiver, in CPU
time (``time.process_time``), best of ``--repeat``::

    .venv/bin/python bench/metrics_overhead.py
    .venv/bin/python bench/metrics_overhead.py --rounds 2000 --batch 10

Divide the difference per task by the CPU a worker process spends per task
(1 / its drain rate with one process, if that process is CPU-bound) for the
share.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000, help="rounds per measurement")
    parser.add_argument("--batch", type=int, default=100, help="tasks per round (claimed ahead)")
    parser.add_argument("--repeat", type=int, default=5, help="best of this many")
    args = parser.parse_args()

    directory = tempfile.mkdtemp(prefix="rdbtasks-metrics-bench-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    import logging

    logging.getLogger("django_rdbtasks").setLevel(logging.WARNING)  # as the benchmark runs

    from django_rdbtasks.backend import RDBTaskBackend, RDBTaskResult
    from django_rdbtasks.compat import TaskResultStatus
    from django_rdbtasks.db.rows import ClaimedRow, Outcome
    from django_rdbtasks.observability import metrics
    from django_rdbtasks.states import OutcomeKind
    from django_rdbtasks.worker.execution import Running
    from django_rdbtasks.worker.reporting import Counters, Reporter
    from tests.testapp import tasks

    now = dt.datetime.now(dt.UTC)

    def pairs() -> list[tuple[Outcome, Running]]:
        made = []
        for i in range(args.batch):
            row = ClaimedRow(
                id=i,
                version=1,
                task_path="tests.testapp.tasks.noop",
                args=[],
                kwargs={},
                attempts=1,
                max_attempts=3,
                queue_name="default",
                backend_name="default",
                priority=0,
                enqueued_at=now,
                started_at=now,
                claimed_at=now,
                run_after=now - dt.timedelta(milliseconds=40),
                history=[],
            )
            outcome = Outcome(i, 1, OutcomeKind.SUCCESS, duration=0.0002, row=row)
            made.append((outcome, Running(row, "w:1")))
        return made

    batch = pairs()
    written: dict = {outcome.id: None for outcome, _ in batch}
    result = RDBTaskResult(
        task=tasks.noop,
        id="x",
        status=TaskResultStatus.RUNNING,
        enqueued_at=now,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=[],
        kwargs={},
        backend="default",
        errors=[],
        worker_ids=[],
    )

    def best(reporter: Reporter, started: bool) -> float:
        """CPU seconds per task: best of ``--repeat``."""
        times = []
        for _ in range(args.repeat):
            begin = time.process_time()
            for _ in range(args.rounds):
                if started:
                    for _ in range(args.batch):
                        reporter.backend.send_signal("task_started", result)
                reporter.report(batch, written)
            times.append((time.process_time() - begin) / (args.rounds * args.batch))
        return min(times)

    backend = RDBTaskBackend.__new__(RDBTaskBackend)  # only send_signal is used
    try:
        off = best(Reporter(backend, Counters(), str), started=True)
        metrics.enable()
        on = best(Reporter(backend, Counters(), str), started=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"{args.batch} tasks per round, {args.rounds} rounds, best of {args.repeat}:")
    print(f"  metrics off: {off * 1e6:6.2f} µs CPU per task (task_started signal + report)")
    print(f"  metrics on:  {on * 1e6:6.2f} µs CPU per task")
    print(f"  cost:        {(on - off) * 1e6:6.2f} µs CPU per task")
    return 0


if __name__ == "__main__":
    sys.exit(main())
