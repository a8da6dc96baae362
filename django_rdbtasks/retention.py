"""Deleting old finished tasks, a small batch per transaction.

A single ``DELETE … WHERE finished_at < …`` over millions of rows would hold
its locks (and on MySQL, gap locks on the index) for as long as it runs, and
bloat one huge transaction. Instead each batch picks at most ``batch_size``
ids through the ``finished_at`` index and deletes them in a short transaction
of its own, so workers claiming and completing tasks never wait long; the
rows that hang off them go with them, by relation, not an instance loaded per
task: on PostgreSQL the whole batch is one statement.

``prune_by_setting()`` is what a long-running process (the scheduler) calls
every minute to apply ``RDBTASKS_RETENTION``, and again at once while rows
are left.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from django.db import connections, router, transaction
from django.db.models import CASCADE, DO_NOTHING, SET_NULL, Count, Q
from django.db.models.deletion import get_candidate_relations_to_delete
from django.db.models.signals import post_delete, pre_delete

from .conf import RETENTION, project_settings
from .db.postgresql.pruning import Link, delete_batch_sql
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
    #: Stopped by ``time_budget`` or ``max_batches`` with rows left to delete, or
    #: left rows that another transaction held locked.
    incomplete: bool = False

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


@dataclass(frozen=True, slots=True)
class Prunable:
    """Tasks finished in ``statuses`` before ``cutoff`` (a database time)."""

    statuses: list[str]
    cutoff: dt.datetime

    @property
    def q(self) -> Q:
        return Q(status__in=self.statuses, finished_at__lt=self.cutoff)


def prunable(
    older_than: dt.timedelta,
    statuses: Iterable[str] = FINISHED,
    *,
    using: str | None = None,
    now: dt.datetime | None = None,
) -> Q:
    """The condition on tasks finished in ``statuses`` more than ``older_than`` ago."""
    return _prunable(older_than, statuses, using=using, now=now).q


def _prunable(
    older_than: dt.timedelta,
    statuses: Iterable[str],
    *,
    using: str | None,
    now: dt.datetime | None,
) -> Prunable:
    statuses = _finished_only(statuses)
    using = using or router.db_for_write(Task)
    return Prunable(statuses, (now or database_now(using)) - older_than)


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
    bound one call, and the result says whether rows were left (rows another
    transaction holds locked are skipped, not waited for, and count as left). ``now``
    fixes the clock, so a deletion confirmed from a count takes the rows
    counted and none that finished meanwhile.
    """
    using = using or router.db_for_write(Task)
    condition = _prunable(older_than, statuses, using=using, now=now)
    result = PruneResult()
    started = time.monotonic()
    while True:
        if max_batches is not None and result.batches >= max_batches:
            result.incomplete = True
            break
        if time_budget is not None and time.monotonic() - started >= time_budget:
            result.incomplete = True
            break
        deleted, candidates = _delete_batch(using, condition, batch_size)
        if not candidates:
            break
        if sum(deleted.values()) < candidates:
            result.incomplete = True  # rows someone else held: left to a later call
        if not deleted:
            break  # every one of them held: the next batch would find them again
        result.batches += 1
        for status, n in deleted.items():
            result.deleted[status] = result.deleted.get(status, 0) + n
        if progress is not None:
            progress(result)
        if candidates < batch_size:
            break
        if pause:
            time.sleep(pause)
    return result


def _delete_batch(using: str, condition: Prunable, batch_size: int) -> tuple[dict[str, int], int]:
    """Delete one batch: the tasks deleted by status, and how many were candidates."""
    relations = _relations()
    if connections[using].vendor == "postgresql" and _in_one_statement(relations):
        return _delete_batch_in_one_statement(using, condition, batch_size, relations)
    tasks = Task.objects.using(using)
    # Oldest first, through the finished_at index: each batch is a short range scan.
    candidates = list(
        tasks.filter(condition.q).order_by("finished_at").values_list("pk", flat=True)[:batch_size]
    )
    if not candidates:
        return {}, 0
    locking = connections[using].features.has_select_for_update_skip_locked
    with transaction.atomic(using=using):
        # Still prunable (not requeued meanwhile), and held until deleted. A row
        # someone else holds (an admin's requeue, say) is left to a later batch
        # rather than waited for.
        rows = list(
            tasks.filter(pk__in=candidates)
            .filter(condition.q)
            .select_for_update(skip_locked=locking)
            .values_list("pk", "status")
        )
        if rows:
            _delete_tasks(using, [pk for pk, _ in rows])
    counts: dict[str, int] = {}
    for _, status in rows:
        counts[status] = counts.get(status, 0) + 1
    return counts, len(candidates)


def _delete_batch_in_one_statement(
    using: str, condition: Prunable, batch_size: int, relations: list[Any]
) -> tuple[dict[str, int], int]:
    """PostgreSQL: the batch's rows, what hangs off them and the tasks, in one statement
    (``db/postgresql/pruning.py`` writes it).

    The same work as the other path (oldest first through the finished_at
    index, locked and skipped if someone holds them, each relation by its
    ``on_delete``), without the ids making a round trip through Python: that
    was most of what the deleting process spent per task.
    """
    quote = connections[using].ops.quote_name
    pk = Task._meta.pk
    assert pk is not None
    links = []
    for relation in relations:
        field = relation.field
        if field.remote_field.on_delete is CASCADE:
            deleted_through: tuple[str, ...] = ()
        elif field.remote_field.on_delete is SET_NULL:
            deleted_through = tuple(
                quote(other.field.column)
                for other in relations
                if other.related_model is relation.related_model
                and other.field.remote_field.on_delete is CASCADE
            )
        else:
            continue
        links.append(
            Link(
                table=quote(relation.related_model._meta.db_table),
                column=quote(field.column),
                cascade=field.remote_field.on_delete is CASCADE,
                deleted_through=deleted_through,
            )
        )
    sql = delete_batch_sql(quote(Task._meta.db_table), quote(str(pk.column)), links)
    window: list[Any] = [condition.statuses, condition.cutoff, batch_size]
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(sql, [*window, *window])
        rows = cursor.fetchall()
    counts = {status: int(n) for status, n in rows if status is not None}
    # The row without a status is the count of candidates, the held ones included.
    return counts, next(int(n) for status, n in rows if status is None)


def _delete_tasks(using: str, pks: list[Any]) -> None:
    """Delete these tasks and what hangs off them: a statement per relation.

    What Django's deletion collector does (the rows of a relation that
    cascades are deleted, those of a SET_NULL one unlinked), without loading an
    instance of every task first and deleting them a hundred at a time: a
    fixed number of statements per batch (docs/admin.md, Retention). Where only
    the collector will do (a receiver of Task's delete signals, a relation with
    another ``on_delete``), the collector it is.
    """
    relations = _relations()
    if _needs_collector(relations):
        Task.objects.using(using).filter(pk__in=pks).only("pk").delete()
        return
    for relation in relations:
        field = relation.field
        linked = relation.related_model._base_manager.using(using).filter(
            **{f"{field.name}__in": pks}
        )
        if field.remote_field.on_delete is CASCADE:
            linked.delete()  # the collector again, for whatever hangs off these
        elif field.remote_field.on_delete is SET_NULL:
            linked.update(**{field.name: None})
    connection = connections[using]
    pk = Task._meta.pk
    assert pk is not None
    values = [pk.get_db_prep_value(value, connection) for value in pks]
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {quote(Task._meta.db_table)} WHERE {quote(str(pk.column))} "
            f"IN ({', '.join(['%s'] * len(values))})",
            values,
        )


def _relations() -> list[Any]:
    """The relations that point at tasks (reverse foreign keys, one-to-ones)."""
    # Any: the stubs type Options invariantly, and these are reverse relations (.field).
    return list(get_candidate_relations_to_delete(cast(Any, Task._meta)))


def _needs_collector(relations: Iterable[Any]) -> bool:
    if pre_delete.has_listeners(Task) or post_delete.has_listeners(Task):
        return True
    if any(hasattr(field, "bulk_related_objects") for field in Task._meta.private_fields):
        return True  # a GenericRelation: the collector knows its rows
    return any(
        relation.field.remote_field.on_delete not in (CASCADE, SET_NULL, DO_NOTHING)
        for relation in relations
    )


def _in_one_statement(relations: list[Any]) -> bool:
    """Whether a statement can do all a batch's deletion: no receiver, and nothing
    hanging off the rows that cascade (their own relations, their receivers)."""
    if _needs_collector(relations):
        return False
    for relation in relations:
        if relation.field.remote_field.on_delete is not CASCADE:
            continue
        model = relation.related_model
        if pre_delete.has_listeners(model) or post_delete.has_listeners(model):
            return False
        if any(get_candidate_relations_to_delete(model._meta)) or model._meta.private_fields:
            return False
    return True


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
    configured = project_settings()
    configured.require(RETENTION)
    return dict(configured.retention)


def prune_by_setting(
    *,
    using: str | None = None,
    time_budget: float | None = 10.0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    now: dt.datetime | None = None,
) -> PruneResult | None:
    """Apply ``RDBTASKS_RETENTION`` for at most ``time_budget`` seconds (None: until done).

    Meant to be called every minute by a long-running process; any number
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
