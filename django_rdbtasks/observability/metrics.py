"""Prometheus metrics: what the worker processes did, and what the database holds.

Two sources, served two ways (docs/observability.md):

- ``WorkerMetrics``: counters and histograms per queue and task path, kept by
  the processes that enqueue and run tasks. ``runworkers --metrics-port``
  enables them in its whole process tree (prometheus_client's multiprocess
  mode: every process writes its values to files in one directory, the
  supervisor's HTTP server adds them up on each scrape).
- ``DatabaseCollector``: queue depth, lag and live workers, read from the
  database at scrape time with the admin's queries (``snapshots.snapshot``); served
  by the Django view in ``views.py``, so one scrape target covers every host.

Nothing here imports prometheus_client until metrics are enabled, and a worker
whose metrics are off pays one ``is None`` test per batch of outcomes.
"""

from __future__ import annotations

import bisect
import datetime as dt
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..cleanup import SHOWN_AFTER, CleanupReport, HolderKind
from ..states import OutcomeKind

if TYPE_CHECKING:
    from ..db.rows import ClaimedRow, Outcome
    from ..worker.execution import Running

logger = logging.getLogger("django_rdbtasks.worker")

#: The environment variable prometheus_client reads for its multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LABELS = ("queue", "task")
#: Seconds. Short tasks are this queue's common case, hence the millisecond buckets.
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, float("inf"),
)  # fmt: skip
DELAY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, float("inf"),
)  # fmt: skip

#: The outcome counters, in the order of a ``_Series``' counts.
SUCCEEDED, FAILED, RETRIED, CANCELLED, HANDED_BACK, RECLAIMED, LOST = range(7)
_COUNTER_OF_KIND: dict[OutcomeKind, int] = {
    OutcomeKind.SUCCESS: SUCCEEDED,
    OutcomeKind.FAILURE: FAILED,
    OutcomeKind.ABANDON: FAILED,
    OutcomeKind.RETRY: RETRIED,
    OutcomeKind.CANCELLED: CANCELLED,
    OutcomeKind.HANDOVER: HANDED_BACK,
    OutcomeKind.POSTPONE: HANDED_BACK,
}
#: Kinds after which the task body ran (so it has a duration and a start delay).
_RAN = frozenset(
    {
        OutcomeKind.SUCCESS,
        OutcomeKind.FAILURE,
        OutcomeKind.RETRY,
        OutcomeKind.CANCELLED,
        OutcomeKind.HANDOVER,
    }
)

_current: WorkerMetrics | None = None


def current() -> WorkerMetrics | None:
    """This process's metrics, or None when they are off (the common, free case)."""
    return _current


def enable(registry: Any = None) -> WorkerMetrics:
    """Turn the counters and histograms on in this process (and the ones it forks).

    ``runworkers --metrics-port`` calls it in the supervisor before forking. A
    web process that should count what it enqueues calls it too (in an
    ``AppConfig.ready``, say): the metrics then join prometheus_client's
    default registry, served by whatever serves that registry there.
    """
    global _current
    if _current is None:
        _current = WorkerMetrics(registry)
        _current.connect_signals()
    return _current


class _Series:
    """The metric children of one (queue, task path): looked up once, then reused."""

    __slots__ = ("counters", "delay", "duration", "enqueued", "started")

    def __init__(self, metrics: WorkerMetrics, queue: str, path: str) -> None:
        self.enqueued = metrics.enqueued.labels(queue, path)
        self.started = metrics.started.labels(queue, path)
        self.counters = [family.labels(queue, path) for family in metrics.outcome_families]
        self.duration = metrics.duration.labels(queue, path)
        self.delay = metrics.start_delay.labels(queue, path)


class _Batch:
    """What one batch of outcomes adds to a series, added up before touching the metrics."""

    __slots__ = ("counts", "delays", "durations")

    def __init__(self) -> None:
        self.counts = [0] * 7
        self.durations: list[float] = []
        self.delays: list[float] = []


class WorkerMetrics:
    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        registry = REGISTRY if registry is None else registry

        def counter(name: str, text: str) -> Any:
            return Counter(name, text, LABELS, registry=registry)

        self.enqueued = counter("rdbtasks_tasks_enqueued", "Tasks enqueued.")
        self.started = counter("rdbtasks_tasks_started", "Task attempts started.")
        self.outcome_families = [
            counter("rdbtasks_tasks_succeeded", "Tasks that succeeded."),
            counter(
                "rdbtasks_tasks_failed",
                "Tasks that failed for good (no attempt left, not retryable, or "
                "reclaimed from a lost worker with no attempt left).",
            ),
            counter("rdbtasks_tasks_retried", "Failed attempts that will be retried."),
            counter("rdbtasks_tasks_cancelled", "Tasks cancelled by an operator while running."),
            counter(
                "rdbtasks_tasks_handed_back",
                "Attempts given back unspent to run later (handed over, or postponed "
                "behind a running singleton).",
            ),
            counter(
                "rdbtasks_tasks_reclaimed",
                "Tasks taken over from a worker whose lease had expired.",
            ),
            counter(
                "rdbtasks_tasks_lost",
                "Results this worker could not write: its lease had expired and "
                "another worker reclaimed the task.",
            ),
        ]
        self.duration = Histogram(
            "rdbtasks_task_duration_seconds",
            "How long task attempts ran.",
            LABELS,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.start_delay = Histogram(
            "rdbtasks_task_start_delay_seconds",
            "From when an attempt was due (enqueued, or its run_after) to its claim.",
            LABELS,
            buckets=DELAY_BUCKETS,
            registry=registry,
        )
        # One process (the supervisor) sets it; its file goes when it exits.
        self.worker_processes = Gauge(
            "rdbtasks_worker_processes",
            "Worker processes this runworkers supervisor keeps running.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self._series: dict[tuple[str, str], _Series] = {}
        self._started_by_task: dict[int, tuple[Any, Any]] = {}

    @staticmethod
    def _batch(batches: dict[tuple[str, str], _Batch], row: ClaimedRow) -> _Batch:
        key = (row.queue_name, row.task_path)
        batch = batches.get(key)
        if batch is None:
            batch = batches[key] = _Batch()
        return batch

    def series(self, queue: str, path: str) -> _Series:
        key = (queue, path)
        found = self._series.get(key)
        if found is None:
            # Two threads may both build it: labels() returns the same children.
            found = self._series[key] = _Series(self, queue, path)
        return found

    # -- the framework's signals -------------------------------------------------------

    def connect_signals(self) -> None:
        from ..backend import RDBTaskBackend
        from ..compat import framework_signals

        self._backend_class = RDBTaskBackend
        # The framework's module only: on Django 6.1 with the backport installed,
        # the backend sends to both, and each task would be counted twice.
        framework_signals.task_enqueued.connect(self._on_enqueued, weak=False)
        framework_signals.task_started.connect(self._on_started, weak=False)

    def disconnect_signals(self) -> None:
        from ..compat import framework_signals

        framework_signals.task_enqueued.disconnect(self._on_enqueued)
        framework_signals.task_started.disconnect(self._on_started)

    def _on_enqueued(self, sender: Any, task_result: Any, **kwargs: Any) -> None:
        if issubclass(sender, self._backend_class):
            task = task_result.task
            self.series(task.queue_name, task.module_path).enqueued.inc()

    def _on_started(self, sender: Any, task_result: Any, **kwargs: Any) -> None:
        # Once per task run: the child is cached by the Task object itself (held
        # in the cache, so its id cannot be reused by another while there).
        task = task_result.task
        cached = self._started_by_task.get(id(task))
        if cached is not None and cached[0] is task:
            cached[1].inc()
            return
        if not issubclass(sender, self._backend_class):
            return
        child = self.series(task.queue_name, task.module_path).started
        if len(self._started_by_task) >= 1000:  # copies made by using(): keep it bounded
            self._started_by_task.clear()
        self._started_by_task[id(task)] = (task, child)
        child.inc()

    # -- outcomes, from the worker's Reporter --------------------------------------------

    def record(
        self, pairs: Sequence[tuple[Outcome, Running]], written: dict[Any, bool | None]
    ) -> None:
        """Count a batch of outcomes (as written, or found fenced off).

        The batch is added up first and each metric touched once per (queue,
        task): a multiprocess value is a locked write to a memory-mapped file,
        and a worker finishes thousands of tasks a second.
        """
        batches: dict[tuple[str, str], _Batch] = {}
        for outcome, running in pairs:
            kind = outcome.kind
            row = running.row
            if kind == OutcomeKind.RELEASE or kind == OutcomeKind.NOTE:
                # Runs later, counted then; a takeover handed back unstarted
                # has still taken the task over.
                if kind == OutcomeKind.RELEASE and outcome.id in written and taken_over(row):
                    self._batch(batches, row).counts[RECLAIMED] += 1
                continue
            batch = self._batch(batches, row)
            takeover = taken_over(row)
            if kind in _RAN:
                batch.durations.append(outcome.duration)
                if not takeover:  # a takeover's wait is the lease, not the queue
                    delay = (row.claimed_at - row.run_after).total_seconds()
                    batch.delays.append(delay if delay > 0 else 0.0)
            if outcome.id not in written:
                batch.counts[LOST] += 1
                continue
            batch.counts[_COUNTER_OF_KIND[kind]] += 1
            if takeover:
                batch.counts[RECLAIMED] += 1
        for (queue, path), batch in batches.items():
            series = self.series(queue, path)
            for index, count in enumerate(batch.counts):
                if count:
                    series.counters[index].inc(count)
            if batch.durations:
                observe_many(series.duration, batch.durations, DURATION_BUCKETS)
            if batch.delays:
                observe_many(series.delay, batch.delays, DELAY_BUCKETS)


def taken_over(row: ClaimedRow) -> bool:
    """Whether this claim took the row over from a worker whose lease had expired."""
    return row.lost_from is not None or row.taken_over


def observe_many(child: Any, values: list[float], bounds: Sequence[float]) -> None:
    """``child.observe(v)`` for each value, with one write per bucket touched.

    prometheus_client has no batch observe; its histogram child keeps one
    value per bucket (``_buckets``, not cumulative) and ``_sum``. Should a
    release rename them, this falls back to one observe per value.
    """
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if buckets is None or total is None or len(buckets) != len(bounds):
        for value in values:
            child.observe(value)
        return
    counts: dict[int, int] = {}
    for value in values:
        index = bisect.bisect_left(bounds, value)
        counts[index] = counts.get(index, 0) + 1
    total.inc(sum(values))
    for index, count in counts.items():
        buckets[index].inc(count)


# -- the process tree of runworkers --------------------------------------------------------


class MetricsServer:
    """The supervisor's side of multiprocess mode: the directory, the HTTP server.

    ``prepare()`` runs before any child is forked: the directory must be in
    the environment before prometheus_client creates its first value.
    """

    def __init__(self, port: int, address: str = "127.0.0.1") -> None:
        self.port = port
        self.address = address
        self.directory = ""
        self.server: Any = None
        self.metrics: WorkerMetrics | None = None

    def prepare(self) -> WorkerMetrics:
        remove_stale_directories()
        # A fresh directory: files left by an earlier run would be added in.
        self.directory = tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-")
        os.environ[MULTIPROC_ENV] = self.directory
        from prometheus_client import values

        # prometheus_client picks its value class when first imported; if the
        # project imported it before (another app's metrics), pick again so
        # that our metrics, created next, are written to the directory.
        values.ValueClass = values.get_value_class()
        self.metrics = enable()
        return self.metrics

    def start(self) -> int:
        """Serve ``/metrics`` from a thread of this process; return the port (0 picks one)."""
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.directory)
        self.server, _thread = start_http_server(self.port, addr=self.address, registry=registry)
        port = int(self.server.server_port)
        logger.info(
            "metrics served on http://%s:%d/metrics (multiprocess directory %s)",
            self.address,
            port,
            self.directory,
        )
        return port

    def in_child(self) -> None:
        """In a forked child: let go of the listening socket (the supervisor serves)."""
        if self.server is not None:
            try:
                self.server.socket.close()
            except OSError:
                pass

    def process_gone(self, pid: int | None) -> None:
        if pid is None:
            return
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, path=self.directory)

    def set_worker_processes(self, count: int) -> None:
        if self.metrics is not None:
            self.metrics.worker_processes.set(count)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            if os.environ.get(MULTIPROC_ENV) == self.directory:
                del os.environ[MULTIPROC_ENV]
                from prometheus_client import values

                values.ValueClass = values.get_value_class()


#: The supervisor's directory: this, its pid, a dash and a random part.
DIRECTORY_PREFIX = "rdbtasks-metrics-"


def remove_stale_directories() -> list[str]:
    """Remove the directories of supervisors that are gone without cleaning up (SIGKILL).

    Only this user's, and only those whose supervisor pid no longer exists.
    """
    removed = []
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        pid_text = name[len(DIRECTORY_PREFIX) :].partition("-")[0]
        if not name.startswith(DIRECTORY_PREFIX) or not pid_text.isdigit():
            continue
        path = os.path.join(root, name)
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except OSError:
            continue  # not ours to judge (another user's pid), or gone meanwhile
    return removed


# -- the database's gauges -----------------------------------------------------------------

#: The ``state`` label of ``rdbtasks_queue_tasks``: the fields of ``snapshots.QueueStats``.
QUEUE_STATES = ("ready", "scheduled", "waiting", "running", "stalled")


class DatabaseCollector:
    """Queue depth, lag and workers, read at scrape time (the admin dashboard's queries)."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def describe(self) -> list[Any]:
        return []  # nothing to check at registration (that would query the database)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from .. import snapshots

        # A short window: the finished counts are not exported, only computed.
        # Off the primary when the backend has a READ_DATABASE (reads.py).
        snap = snapshots.snapshot(
            self.using, window=dt.timedelta(minutes=1), replica=True, cleanup=True
        )
        depth = GaugeMetricFamily(
            "rdbtasks_queue_tasks",
            "Tasks per queue and state: ready (due), scheduled (run_after ahead), "
            "waiting (on parent tasks), running, stalled (running, lease expired).",
            labels=["queue", "state"],
        )
        lag = GaugeMetricFamily(
            "rdbtasks_queue_lag_seconds",
            "How long the oldest runnable task of the queue has waited (0: none waits).",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "rdbtasks_queue_paused_seconds",
            "How long an operator has had the queue paused (0: it runs).",
            labels=["queue"],
        )
        for name, stats in snap.queues.items():
            for state in QUEUE_STATES:
                depth.add_metric([name, state], getattr(stats, state))
            lag.add_metric([name], stats.lag(snap.now) or 0.0)
            since = stats.paused_since
            paused.add_metric([name], (snap.now - since).total_seconds() if since else 0.0)
        yield depth
        yield lag
        yield paused
        yield GaugeMetricFamily(
            "rdbtasks_workers_alive",
            "Worker processes with a heartbeat in the last 90 seconds.",
            value=len(snap.workers),
        )
        yield GaugeMetricFamily(
            "rdbtasks_workers_gone",
            "Worker processes that stopped heartbeating without deregistering.",
            value=snap.gone_workers,
        )
        yield GaugeMetricFamily(
            "rdbtasks_task_rows",
            "Rows in the task table (the planner's estimate on PostgreSQL and MySQL).",
            value=snap.rows.value,
        )
        if snap.off_primary and snap.replica_lag is not None:
            yield GaugeMetricFamily(
                "rdbtasks_replica_lag_seconds",
                "How far behind its primary the replica these gauges are read from is.",
                value=snap.replica_lag,
            )
        if snap.cleanup is not None and snap.cleanup.supported:
            yield from cleanup_metrics(snap.cleanup)


def cleanup_metrics(report: CleanupReport) -> Iterator[Any]:
    """What holds back the cleanup of the tables (cleanup.py; docs/admin.md says what to do)."""
    from prometheus_client.core import GaugeMetricFamily

    yield GaugeMetricFamily(
        "rdbtasks_cleanup_oldest_transaction_seconds",
        "How long the oldest open transaction or snapshot of the task database has held back "
        "the cleanup of dead rows (0: none is open).",
        value=report.oldest_age or 0.0,
    )
    holders = GaugeMetricFamily(
        "rdbtasks_cleanup_holders",
        f"Sessions open for {SHOWN_AFTER:g}s or more, prepared transactions, replication slots "
        "and replicas holding back the cleanup of dead rows, by kind.",
        labels=["kind"],
    )
    for kind in (HolderKind.SESSION, HolderKind.PREPARED, HolderKind.SLOT, HolderKind.REPLICA):
        holders.add_metric([kind], sum(holder.kind == kind for holder in report.holders))
    yield holders
    if report.oldest_xid_age is not None:
        yield GaugeMetricFamily(
            "rdbtasks_cleanup_xmin_age_transactions",
            "PostgreSQL: transactions begun since the oldest one a holder can still see "
            "(age(xmin)), slots and replicas included.",
            value=report.oldest_xid_age,
        )
    if report.history_length is not None:
        yield GaugeMetricFamily(
            "rdbtasks_innodb_history_list_length",
            "MySQL/MariaDB: undo records of committed changes not purged yet.",
            value=report.history_length,
        )
    if report.tables:
        dead = GaugeMetricFamily(
            "rdbtasks_table_dead_rows",
            "PostgreSQL: dead row versions in each of the app's tables (pg_stat_user_tables).",
            labels=["table"],
        )
        vacuumed = GaugeMetricFamily(
            "rdbtasks_table_last_vacuum_timestamp_seconds",
            "PostgreSQL: when each of the app's tables was last vacuumed, by hand or by "
            "autovacuum (Unix time; absent: never).",
            labels=["table"],
        )
        for table in report.tables:
            dead.add_metric([table.table], table.dead_rows)
            if table.last_vacuumed is not None:
                vacuumed.add_metric([table.table], table.last_vacuumed.timestamp())
        yield dead
        yield vacuumed
