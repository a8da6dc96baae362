"""Deleting old finished tasks, a small batch per transaction.

A single ``DELETE … WHERE finished_at < …`` over millions of rows would hold
its locks (and on MySQL, gap locks on the index) for as long as it runs, and
bloat one huge transaction. Instead each batch picks at most ``batch_size``
ids through the ``finished_at`` index and deletes them in a short transaction
of its own, so workers claiming and completing tasks never wait long.

``prune_by_setting()`` is what a long-running process (the scheduler) calls
every few minutes to apply ``RDBTASKS_RETENTION``.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import router, transaction
from django.db.models import Count, Q

from .durations import parse_age
from .jobs import database_now
from .locks import LeasedLock
from .models import Task, TaskStatus, Worker

logger = logging.getLogger("django_rdbtasks.retention")

FINISHED = (TaskStatus.SUCCESSFUL, TaskStatus.FAILED, TaskStatus.CANCELLED)
DEFAULT_BATCH_SIZE = 1000
#: ``prunetasks`` asks before deleting more tasks than this (``--yes`` does not ask).
CONFIRM_ABOVE = 1000
#: Rows of workers that stopped or vanished longer ago than this are deleted.
WORKER_RETENTION = dt.timedelta(days=1)


@dataclass(slots=True)
class PruneResult:
    deleted: dict[str, int] = field(default_factory=dict)  # by status
    batches: int = 0
    workers: int = 0
    #: Stopped by ``time_budget`` or ``max_batches`` with rows left to delete.
    incomplete: bool = False

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


def prunable(
    older_than: dt.timedelta,
    statuses: Iterable[str] = FINISHED,
    *,
    using: str | None = None,
    now: dt.datetime | None = None,
) -> Q:
    """The condition on tasks finished in ``statuses`` more than ``older_than`` ago."""
    statuses = _finished_only(statuses)
    using = using or router.db_for_write(Task)
    cutoff = (now or database_now(using)) - older_than
    return Q(status__in=statuses, finished_at__lt=cutoff)


def count_prunable(
    older_than: dt.timedelta,
    statuses: Iterable[str] = FINISHED,
    *,
    using: str | None = None,
    now: dt.datetime | None = None,
) -> dict[str, int]:
    """What ``prune`` would delete, by status (for ``--dry-run``)."""
    counts = {status: 0 for status in _finished_only(statuses)}
    for (status, _queue), n in count_prunable_by_queue(
        older_than, statuses, using=using, now=now
    ).items():
        counts[status] += n
    return counts


def count_prunable_by_queue(
    older_than: dt.timedelta,
    statuses: Iterable[str] = FINISHED,
    *,
    using: str | None = None,
    now: dt.datetime | None = None,
) -> dict[tuple[str, str], int]:
    """What ``prune`` would delete, by (status, queue): read from the finished_at index alone."""
    using = using or router.db_for_write(Task)
    rows = (
        Task.objects.using(using)
        .filter(prunable(older_than, statuses, using=using, now=now))
        .order_by()
        .values("status", "queue_name")
        .annotate(n=Count("id"))
    )
    return {(row["status"], row["queue_name"]): row["n"] for row in rows}


def prune(
    older_than: dt.timedelta,
    statuses: Iterable[str] = FINISHED,
    *,
    using: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    pause: float = 0.0,
    time_budget: float | None = None,
    max_batches: int | None = None,
    progress: Callable[[PruneResult], None] | None = None,
    now: dt.datetime | None = None,
) -> PruneResult:
    """Delete tasks finished in ``statuses`` more than ``older_than`` ago, in batches.

    The cutoff is fixed at the start (database clock), so rows finishing while
    this runs are not chased. ``pause`` sleeps between batches to leave the
    database to the workers; ``time_budget`` (seconds) and ``max_batches``
    bound one call, and the result says whether rows were left. ``now``
    fixes the clock, so a deletion confirmed from a count takes the rows
    counted and none that finished meanwhile.
    """
    using = using or router.db_for_write(Task)
    condition = prunable(older_than, statuses, using=using, now=now)
    result = PruneResult()
    started = time.monotonic()
    while True:
        if max_batches is not None and result.batches >= max_batches:
            result.incomplete = True
            break
        if time_budget is not None and time.monotonic() - started >= time_budget:
            result.incomplete = True
            break
        deleted = _delete_batch(using, condition, batch_size)
        if not deleted:
            break
        result.batches += 1
        for status, n in deleted.items():
            result.deleted[status] = result.deleted.get(status, 0) + n
        if progress is not None:
            progress(result)
        if sum(deleted.values()) < batch_size:
            break
        if pause:
            time.sleep(pause)
    return result


def _delete_batch(using: str, condition: Q, batch_size: int) -> dict[str, int]:
    tasks = Task.objects.using(using)
    # Oldest first, through the finished_at index: each batch is a short range scan.
    rows = list(
        tasks.filter(condition).order_by("finished_at").values_list("pk", "status")[:batch_size]
    )
    if not rows:
        return {}
    counts: dict[str, int] = {}
    for _, status in rows:
        counts[status] = counts.get(status, 0) + 1
    with transaction.atomic(using=using):
        # .only("pk"): the collector loads instances to cascade (dependencies) and
        # to null JobRecord.task; it needs no JSON columns for that.
        tasks.filter(pk__in=[pk for pk, _ in rows]).filter(condition).only("pk").delete()
    return counts


def prune_workers(older_than: dt.timedelta = WORKER_RETENTION, *, using: str | None = None) -> int:
    """Delete rows of workers stopped or silent for longer than ``older_than``."""
    using = using or router.db_for_write(Worker)
    cutoff = database_now(using) - older_than
    deleted, _ = (
        Worker.objects.using(using)
        .filter(Q(stopped_at__lt=cutoff) | Q(last_heartbeat_at__lt=cutoff))
        .delete()
    )
    return deleted


def retention_setting() -> dict[str, dt.timedelta]:
    """``RDBTASKS_RETENTION``: how long to keep finished tasks, by status.

    ::

        RDBTASKS_RETENTION = {"SUCCESSFUL": "7d", "CANCELLED": "7d", "FAILED": "30d"}

    A status left out is kept forever. A bad value raises ImproperlyConfigured
    (the system check ``django_rdbtasks.E020`` reports it first).
    """
    ages, problems = read_retention(getattr(settings, "RDBTASKS_RETENTION", None))
    if problems:
        raise ImproperlyConfigured(" ".join(problems))
    return ages


def read_retention(raw: object) -> tuple[dict[str, dt.timedelta], list[str]]:
    """The ages of a ``RDBTASKS_RETENTION`` value and what is wrong with it, one line each."""
    if not raw:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, [
            f"RDBTASKS_RETENTION must be a dict of status to age, like "
            f'{{"SUCCESSFUL": "7d", "FAILED": "30d"}}, not {raw!r}.'
        ]
    ages: dict[str, dt.timedelta] = {}
    problems: list[str] = []
    for status, age in raw.items():
        if status not in FINISHED:
            problems.append(
                f"RDBTASKS_RETENTION: {status!r} is not a finished status "
                f"({', '.join(FINISHED)}); only finished tasks can be pruned."
            )
            continue
        try:
            ages[status] = parse_age(age)
        except ValueError as exc:
            problems.append(f"RDBTASKS_RETENTION[{status!r}]: {exc}")
    return ages, problems


def prune_by_setting(
    *,
    using: str | None = None,
    time_budget: float | None = 10.0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    now: dt.datetime | None = None,
) -> PruneResult | None:
    """Apply ``RDBTASKS_RETENTION`` for at most ``time_budget`` seconds (None: until done).

    Meant to be called every few minutes by a long-running process; any number
    of processes may call it, a leased lock lets one of them work at a time.
    Returns None when another process holds the lock. A backlog (the setting
    was just turned on) is worked off over several calls.
    """
    ages = retention_setting()
    using = using or router.db_for_write(Task)
    lock = LeasedLock("rdbtasks:retention", lease=60.0, using=using)
    if not lock.acquire():
        return None
    lock.start_renewing()  # a long first run must not let a second process in
    try:
        total = PruneResult(workers=prune_workers(using=using))
        deadline = None if time_budget is None else time.monotonic() + time_budget
        for status, age in ages.items():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                total.incomplete = True
                break
            result = prune(
                age, [status], using=using, batch_size=batch_size, time_budget=left, now=now
            )
            total.batches += result.batches
            total.incomplete |= result.incomplete
            for name, n in result.deleted.items():
                total.deleted[name] = total.deleted.get(name, 0) + n
        _log(total)
        return total
    finally:
        lock.stop_renewing()
        lock.release()


def _log(total: PruneResult) -> None:
    if total.total or total.workers:
        logger.info(
            "retention: deleted %d tasks (%s) and %d worker rows%s",
            total.total,
            ", ".join(f"{k} {v}" for k, v in sorted(total.deleted.items())) or "none",
            total.workers,
            "; more left for the next run" if total.incomplete else "",
        )


def _finished_only(statuses: Iterable[str]) -> list[str]:
    statuses = [s.upper() for s in statuses]
    wrong = [s for s in statuses if s not in FINISHED]
    if wrong:
        raise ValueError(
            f"Only finished tasks can be pruned ({', '.join(FINISHED)}), not {', '.join(wrong)}."
        )
    if not statuses:
        raise ValueError("No status to prune.")
    return statuses
