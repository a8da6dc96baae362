"""The task queue at one instant: counts, lag, throughput, workers and health.

Read by the admin's dashboard, ``rdbtasks status`` and the metrics
(``snapshot``), with the helpers the admin and the commands share about the
same rows (``uuid7_floor``, ``capped_count``, the workers' state).

Everything here must stay cheap on a table of millions of rows, because the
dashboard runs it on every load and monitors run ``rdbtasks status`` every few
seconds:

- counts are exact only where an index bounds the work: READY (the claim
  index), RUNNING (the lease index), WAITING, and finished rows of the last
  hour (the ``finished_at`` index);
- the table's total is the planner's estimate on PostgreSQL and MySQL;
- ages and windows are measured against one reading of the database clock,
  the clock that decides leases and ``run_after``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from django.conf import settings
from django.db import connections, router
from django.db.models import Count, Min, Q, QuerySet
from django.db.models.functions import TruncHour, TruncMinute

from .cleanup import CleanupReport, cleanup_report
from .compat import task_backends
from .conf import HEALTH, project_settings
from .db.postgresql.finished import estimated_rows
from .jobs import database_now
from .models import PausedQueue, Task, TaskStatus, Worker
from .models.ready import ready_conditions
from .reads import read_database, replica_lag
from .suggest import did_you_mean

FINISHED = TaskStatus.finished()
#: A worker without a heartbeat for this long is gone (``Worker.objects.alive``).
ALIVE_WITHIN = 90.0
#: Past this many rows an exact count is not worth its cost: shown as "N+".
COUNT_CAP = 100_000


def default_database() -> str:
    return router.db_for_read(Task)


# -- UUIDv7 and time ---------------------------------------------------------------------


def uuid7_floor(moment: dt.datetime) -> uuid.UUID:
    """The smallest UUIDv7 of ``moment``'s millisecond.

    Task ids are UUIDv7, so ``id >= uuid7_floor(t)`` selects the tasks
    enqueued since ``t`` through the primary key index, where a filter on
    ``enqueued_at`` would scan the table. (The id's time comes from the
    enqueuing process's clock: good to the second, which is all a filter needs.)
    """
    millis = max(0, int(moment.timestamp() * 1000))
    return uuid.UUID(int=(millis & (2**48 - 1)) << 80 | 0x7 << 76 | 0b10 << 62)


# -- counts --------------------------------------------------------------------------------


@dataclass(slots=True)
class QueueStats:
    """A queue's tasks by status; the finished ones over the snapshot's window."""

    name: str
    ready: int = 0  # READY and due: what workers would claim now
    scheduled: int = 0  # READY, run_after still ahead (deferred or backing off)
    waiting: int = 0  # WAITING for parent tasks
    running: int = 0  # RUNNING, stalled ones included
    stalled: int = 0  # RUNNING with a lapsed lease: its worker is gone, claimable again
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    #: Since when the longest-waiting runnable task could have run.
    oldest_runnable: dt.datetime | None = None
    #: Since when an operator has paused it (queues.py); None while it runs.
    paused_since: dt.datetime | None = None

    def lag(self, now: dt.datetime) -> float | None:
        """Seconds the oldest runnable task has been waiting; None when none is."""
        if self.oldest_runnable is None:
            return None
        return max(0.0, (now - self.oldest_runnable).total_seconds())

    def add(self, other: QueueStats) -> None:
        for name in ("ready", "scheduled", "waiting", "running", "stalled"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("succeeded", "failed", "cancelled"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.oldest_runnable = _earliest(self.oldest_runnable, other.oldest_runnable)


@dataclass(frozen=True, slots=True)
class RowCount:
    value: int
    #: The planner's estimate (or a capped count), not an exact COUNT(*).
    estimate: bool


@dataclass(slots=True)
class Throughput:
    """Finished tasks per bucket of time, oldest first, the one holding "now" last."""

    starts: list[dt.datetime]
    succeeded: list[int]
    failed: list[int]
    cancelled: list[int]
    bucket: dt.timedelta = dt.timedelta(minutes=1)

    @property
    def peak(self) -> int:
        series = zip(self.succeeded, self.failed, self.cancelled, strict=True)
        return max((sum(counts) for counts in series), default=0)


def bucket_for(window: dt.timedelta) -> dt.timedelta:
    """The chart's bar width for a window: about 50 to 100 bars, on round times."""
    for limit, bucket in (
        (dt.timedelta(hours=2), dt.timedelta(minutes=1)),
        (dt.timedelta(hours=6), dt.timedelta(minutes=5)),
        (dt.timedelta(days=1), dt.timedelta(minutes=15)),
        (dt.timedelta(days=3), dt.timedelta(hours=1)),
        (dt.timedelta(days=7), dt.timedelta(hours=2)),
    ):
        if window <= limit:
            return bucket
    return dt.timedelta(hours=6)


@dataclass(slots=True)
class Snapshot:
    using: str
    vendor: str
    now: dt.datetime
    window: dt.timedelta
    queues: dict[str, QueueStats]
    total: QueueStats
    rows: RowCount
    throughput: Throughput
    workers: list[Worker] = field(default_factory=list)
    gone_workers: int = 0
    #: The alias the counts were read from: ``using``, or its READ_DATABASE.
    read_from: str = ""
    #: Seconds that copy was behind the primary (None: unknown, or read from the primary).
    replica_lag: float | None = None
    #: What holds back the cleanup of the tables (cleanup.py), read on the primary.
    cleanup: CleanupReport | None = None

    @property
    def off_primary(self) -> bool:
        return bool(self.read_from) and self.read_from != self.using

    @property
    def lag(self) -> float | None:
        return self.total.lag(self.now)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``rdbtasks status --json``."""

        def stats(queue: QueueStats) -> dict[str, Any]:
            data = asdict(queue)
            data.pop("name")
            data["oldest_runnable"] = _iso(queue.oldest_runnable)
            data["paused_since"] = _iso(queue.paused_since)
            data["lag_seconds"] = _round(queue.lag(self.now))
            return data

        return {
            "database": self.using,
            "read_database": self.read_from or self.using,
            "replica_lag_seconds": _round(self.replica_lag),
            "vendor": self.vendor,
            "now": _iso(self.now),
            "window_seconds": int(self.window.total_seconds()),
            "rows": {"value": self.rows.value, "estimate": self.rows.estimate},
            "lag_seconds": _round(self.lag),
            "queues": {name: stats(queue) for name, queue in self.queues.items()},
            "total": stats(self.total),
            "workers": {
                "alive": len(self.workers),
                "gone": self.gone_workers,
                "running": sum(w.running for w in self.workers),
                "list": [worker_as_dict(w, self.now) for w in self.workers],
            },
            "cleanup": None if self.cleanup is None else self.cleanup.as_dict(),
        }


def configured_queues(using: str) -> list[str]:
    """Queues named in ``TASKS`` by the backends that keep their tasks in ``using``."""
    from .backend import RDBTaskBackend

    names: set[str] = set()
    for alias in getattr(settings, "TASKS", {}):
        backend = task_backends[alias]
        if isinstance(backend, RDBTaskBackend) and backend.database == using:
            names.update(backend.queues)
    return sorted(names)


def unknown_queue_problems(
    names: Iterable[str], tasks: QuerySet[Task], configured: Iterable[str]
) -> list[str]:
    """What is wrong with queue names an operator typed, one sentence each (none: all known).

    A typo must not read as an empty, healthy queue (``status --queue defualt
    --max-ready 0`` stayed green forever): a name is known if ``configured``
    (the backends' QUEUES) has it or a task of ``tasks`` is in it (a queue
    since removed from QUEUES still holds its tasks).
    """
    known = set(configured)
    problems = []
    for name in dict.fromkeys(names):
        if name in known or tasks.filter(queue_name=name).exists():
            continue
        listed = ", ".join(sorted(known)) or "none"
        problems.append(
            f"No queue {name!r}: no task is in it, and QUEUES has {listed}."
            + did_you_mean(name, known)
        )
    return problems


def snapshot(
    using: str | None = None,
    *,
    window: dt.timedelta = dt.timedelta(hours=1),
    queues: Sequence[str] | None = None,
    replica: bool = False,
    cleanup: bool = False,
) -> Snapshot:
    """Counts per queue and status, lag, throughput and live workers, at one instant.

    ``replica``: read them from the backend's READ_DATABASE, if it has one
    (reads.py); the times are then the replica's clock, and what it shows is
    as old as its replication lag, which the snapshot carries. ``cleanup``:
    also what holds back the cleanup of the tables (cleanup.py), read on the
    primary, whose sessions are the ones vacuum waits for.
    """
    using = using or default_database()
    source = read_database(using) if replica else using
    now = database_now(source)
    tasks = Task.objects.using(source).order_by()
    if queues is not None:  # an empty list is no queue at all, not every queue
        tasks = tasks.filter(queue_name__in=list(queues))
    by_queue: dict[str, QueueStats] = {
        name: QueueStats(name) for name in (configured_queues(using) if queues is None else queues)
    }

    def stats_for(name: str) -> QueueStats:
        return by_queue.setdefault(name, QueueStats(name))

    _count_ready(tasks, ready_conditions(source), now, stats_for)
    _count_running(tasks, now, stats_for)
    _count_waiting(tasks, stats_for)
    throughput = _count_finished(tasks, now, window, stats_for)

    paused = PausedQueue.objects.using(source)
    if queues is not None:
        paused = paused.filter(queue_name__in=list(queues))
    for row in paused:
        stats_for(row.queue_name).paused_since = row.paused_at
    total = QueueStats("total")
    for stats in by_queue.values():
        total.add(stats)
    workers = list(Worker.objects.using(source).alive(ALIVE_WITHIN).order_by("name"))
    return Snapshot(
        using=using,
        vendor=connections[source].vendor,
        now=now,
        window=window,
        queues=dict(sorted(by_queue.items())),
        total=total,
        rows=estimated_task_rows(source),
        throughput=throughput,
        workers=workers,
        gone_workers=gone_workers(source).count(),
        read_from=source,
        replica_lag=replica_lag(source) if source != using else None,
        cleanup=cleanup_report(using) if cleanup else None,
    )


def _count_ready(tasks: QuerySet, arms: list[Q], now: dt.datetime, stats_for: Callable) -> None:
    # One read per READY index (``ready_conditions``), each served by that index
    # alone: (queue_name, priority, run_after).
    for arm in arms:
        rows = (
            tasks.filter(arm)
            .values("queue_name")
            .annotate(
                total=Count("run_after"),
                due=Count("run_after", filter=_le("run_after", now)),
                oldest=Min("run_after"),
            )
        )
        for row in rows:
            stats = stats_for(row["queue_name"])
            stats.ready += row["due"]
            stats.scheduled += row["total"] - row["due"]
            if row["due"]:
                stats.oldest_runnable = _earliest(stats.oldest_runnable, row["oldest"])


def _count_running(tasks: QuerySet, now: dt.datetime, stats_for: Callable) -> None:
    # RUNNING rows are few (bounded by workers x threads x batch), found by the lease index.
    rows = (
        tasks.filter(status=TaskStatus.RUNNING)
        .values("queue_name")
        .annotate(
            total=Count("lease_expires_at"),
            stalled=Count("lease_expires_at", filter=_le("lease_expires_at", now)),
            oldest=Min("lease_expires_at"),
        )
    )
    for row in rows:
        stats = stats_for(row["queue_name"])
        stats.running = row["total"]
        stats.stalled = row["stalled"]
        if row["stalled"]:
            # A stalled task became runnable again when its lease lapsed.
            stats.oldest_runnable = _earliest(stats.oldest_runnable, row["oldest"])


def _count_waiting(tasks: QuerySet, stats_for: Callable) -> None:
    rows = tasks.filter(status=TaskStatus.WAITING).values("queue_name").annotate(n=Count("id"))
    for row in rows:
        stats_for(row["queue_name"]).waiting = row["n"]


def _count_finished(
    tasks: QuerySet, now: dt.datetime, window: dt.timedelta, stats_for: Callable
) -> Throughput:
    """Finished tasks of the window by queue, status and bucket: one range of the index.

    The database groups by minute or by hour (the ``finished_at`` index holds
    status and queue too, so it is read alone); the buckets are summed here.
    """
    bucket = bucket_for(window)
    width = bucket.total_seconds()
    epoch = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    # Buckets fall on round times (whole 15 minutes, whole 2 hours, in UTC);
    # the last one holds "now".
    last = epoch + bucket * int((now - epoch).total_seconds() // width)
    count = max(1, int(window.total_seconds() // width))
    starts = [last - bucket * (count - 1 - i) for i in range(count)]
    series = {status: [0] * count for status in FINISHED}
    attribute = {
        TaskStatus.SUCCESSFUL: "succeeded",
        TaskStatus.FAILED: "failed",
        TaskStatus.CANCELLED: "cancelled",
    }
    trunc = TruncMinute if bucket < dt.timedelta(hours=1) else TruncHour
    rows = (
        tasks.filter(finished_at__gte=now - window, status__in=FINISHED)
        .annotate(moment=trunc("finished_at", tzinfo=dt.UTC))
        .values("queue_name", "status", "moment")
        .annotate(n=Count("finished_at"))
    )
    for row in rows:
        stats = stats_for(row["queue_name"])
        name = attribute[row["status"]]
        setattr(stats, name, getattr(stats, name) + row["n"])
        # The partial first bucket of the window is counted in the first bar.
        bar = int((_as_utc(row["moment"]) - starts[0]).total_seconds() // width)
        series[row["status"]][min(max(bar, 0), count - 1)] += row["n"]
    return Throughput(
        starts=starts,
        succeeded=series[TaskStatus.SUCCESSFUL],
        failed=series[TaskStatus.FAILED],
        cancelled=series[TaskStatus.CANCELLED],
        bucket=bucket,
    )


def estimated_task_rows(using: str | None = None) -> RowCount:
    """How many task rows there are, without counting a big table.

    PostgreSQL and MySQL keep an estimate for the planner (refreshed by
    ANALYZE and autovacuum); SQLite, the development database, is counted.
    """
    using = using or default_database()
    connection = connections[using]
    table = Task._meta.db_table
    estimate: float | None = None
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            estimate = estimated_rows(cursor, table)
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT table_rows FROM information_schema.tables "
                "WHERE table_schema = DATABASE() AND table_name = %s",
                [table],
            )
            row = cursor.fetchone()
            estimate = row[0] if row and row[0] is not None else None
        elif connection.vendor == "sqlite":
            return RowCount(Task.objects.using(using).count(), estimate=False)
    if estimate is not None:
        return RowCount(int(estimate), estimate=True)
    return capped_count(Task.objects.using(using).all())


def capped_count(queryset: QuerySet, cap: int = COUNT_CAP) -> RowCount:
    """COUNT(*), but of at most ``cap + 1`` rows; more is reported as an estimate of ``cap``."""
    counted = queryset.order_by()[: cap + 1].count()
    if counted > cap:
        return RowCount(cap, estimate=True)
    return RowCount(counted, estimate=False)


# -- workers ------------------------------------------------------------------------------


def gone_workers(using: str | None = None) -> QuerySet[Worker]:
    """Workers that stopped heartbeating without saying goodbye (killed, host lost)."""
    using = using or default_database()
    alive = Worker.objects.using(using).alive(ALIVE_WITHIN).values("pk")
    return Worker.objects.using(using).filter(stopped_at__isnull=True).exclude(pk__in=alive)


def worker_state(worker: Worker, now: dt.datetime) -> str:
    """alive, stopped (said goodbye) or gone (no heartbeat for ``ALIVE_WITHIN`` seconds)."""
    if worker.stopped_at is not None:
        return "stopped"
    if (now - worker.last_heartbeat_at).total_seconds() <= ALIVE_WITHIN:
        return "alive"
    return "gone"


def worker_as_dict(worker: Worker, now: dt.datetime) -> dict[str, Any]:
    return {
        "name": worker.name,
        "host": worker.host,
        "pid": worker.pid,
        "state": worker_state(worker, now),
        "queues": list(worker.queues),
        "mode": worker.mode,
        "threads": worker.threads,
        # None: no --batch, claimed ahead adaptively (the registry stores 0).
        "batch": worker.batch or None,
        "running": worker.running,
        "done": worker.done,
        "failed": worker.failed,
        "started_at": _iso(worker.started_at),
        "last_heartbeat_at": _iso(worker.last_heartbeat_at),
        "heartbeat_age_seconds": _round((now - worker.last_heartbeat_at).total_seconds()),
        "stopped_at": _iso(worker.stopped_at),
    }


# -- health ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HealthCheck:
    name: str
    value: float | None
    limit: float
    ok: bool

    def describe(self) -> str:
        value = "none" if self.value is None else f"{round(self.value, 1):g}"
        relation = ">=" if self.name == "MIN_WORKERS" else "<="
        verdict = "ok" if self.ok else "FAILED"
        return f"{self.name.lower()}: {value} (must be {relation} {self.limit:g}) {verdict}"


def health_limits(**overrides: float | None) -> dict[str, float]:
    """``RDBTASKS_HEALTH`` with the non-None ``overrides`` (lower-case names) on top.

    ``ValueError`` names every problem at once: unknown keys (with the nearest
    known one) and values that are not numbers.
    """
    configured = project_settings()
    problems = configured.problems_of(HEALTH)
    if problems:
        raise ValueError(" ".join(problem.message for problem in problems))
    limits = dict(configured.health)
    for name, value in overrides.items():
        if value is not None:
            limits[name.upper()] = float(value)
    return limits


def check_health(snap: Snapshot, limits: dict[str, float]) -> list[HealthCheck]:
    """One check per configured limit; the snapshot is healthy when all are ok."""
    values: dict[str, float | None] = {
        "MAX_LAG": snap.lag,
        "MIN_WORKERS": len(snap.workers),
        "MAX_READY": snap.total.ready,
        "MAX_STALLED": snap.total.stalled,
        "MAX_FAILED": snap.total.failed,
        "MAX_XMIN_AGE": None if snap.cleanup is None else snap.cleanup.oldest_age,
    }
    checks = []
    for name, limit in limits.items():
        value = values[name]
        if name == "MIN_WORKERS":
            ok = value is not None and value >= limit
        else:
            ok = value is None or value <= limit
        checks.append(HealthCheck(name, value, limit, ok))
    return checks


def backend_for_database(using: str) -> Any:
    """The first ``RDBTaskBackend`` keeping its tasks in ``using``, for its operator APIs."""
    from .backend import RDBTaskBackend

    for alias in getattr(settings, "TASKS", {}):
        backend = task_backends[alias]
        if isinstance(backend, RDBTaskBackend) and backend.database == using:
            return backend
    raise LookupError(f"No RDBTaskBackend keeps its tasks in database {using!r}.")


# -- small helpers ------------------------------------------------------------------------


def _le(field_name: str, value: Any) -> Q:
    return Q(**{f"{field_name}__lte": value})


def _earliest(a: dt.datetime | None, b: dt.datetime | None) -> dt.datetime | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _as_utc(value: dt.datetime) -> dt.datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
