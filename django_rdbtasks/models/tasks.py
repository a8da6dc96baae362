"""The task table: its rows, indexes and named queries; and the edges between tasks."""

from __future__ import annotations

import functools
import operator
import os
import time
import uuid
from collections.abc import Iterable
from typing import Any

from django.db import connections, models, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils.translation import gettext_lazy as _

from ..db.claim_order import index_fields
from ..db.functions import DbNow
from ..db.postgresql.finished import move_back_sql, moved_columns
from ..states import TaskStatus
from .ready import READY_DEFERRED, READY_FRESH, READY_LIMITED, ready_conditions, unfinished_rows

#: The statuses of a finished row, as the task path index's condition names them.
FINISHED = [status.value for status in TaskStatus.finished()]


def uuid7() -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 version 7).

    New rows land at the right edge of the primary key index instead of on a
    random page, which keeps inserts cheap on a table of millions of rows.
    """
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10))
    value = (millis & (2**48 - 1)) << 80 | 0x7 << 76 | (rand >> 68) << 64
    value |= 0b10 << 62 | rand & (2**62 - 1)
    return uuid.UUID(int=value)


class StatusIndex(models.Index):
    """A partial index where the database has them, else a leading ``status`` column.

    PostgreSQL and SQLite index only the rows in the given status; MySQL and
    MariaDB have no partial indexes, so there the same index is prefixed with
    ``status`` and the equality on it finds the same range.
    """

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if self.condition is None or schema_editor.connection.features.supports_partial_indexes:
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        plain = models.Index(fields=["status", *self.fields], name=self.name)
        return plain.create_sql(model, schema_editor, using=using, **kwargs)


class NonNullUnique(models.UniqueConstraint):
    """Unique among the rows whose fields are not NULL (NULLs never collide anyway).

    Where the database has partial indexes (PostgreSQL, SQLite) a row whose key
    is NULL has no entry, so the many writes that leave it NULL (every claim
    and outcome of a task without a dedup key) touch nothing of this index.
    MySQL and MariaDB have no partial unique constraints: there it is a plain
    unique constraint, as it was.
    """

    def __init__(self, *, fields: list[str], name: str) -> None:
        condition = Q(**{f"{field}__isnull": False for field in fields})
        super().__init__(fields=fields, name=name, condition=condition)

    def deconstruct(self) -> Any:
        path, args, kwargs = super().deconstruct()
        kwargs.pop("condition", None)
        return path, args, kwargs

    def _plain(self, schema_editor: Any) -> models.UniqueConstraint | None:
        if schema_editor.connection.features.supports_partial_indexes:
            return None
        return models.UniqueConstraint(fields=self.fields, name=self.name)

    def constraint_sql(self, model: Any, schema_editor: Any) -> Any:
        plain = self._plain(schema_editor)
        if plain is not None:
            return plain.constraint_sql(model, schema_editor)
        return super().constraint_sql(model, schema_editor)

    def create_sql(self, model: Any, schema_editor: Any) -> Any:
        plain = self._plain(schema_editor)
        if plain is not None:
            return plain.create_sql(model, schema_editor)
        return super().create_sql(model, schema_editor)

    def remove_sql(self, model: Any, schema_editor: Any) -> Any:
        plain = self._plain(schema_editor)
        if plain is not None:
            return plain.remove_sql(model, schema_editor)
        return super().remove_sql(model, schema_editor)


def _no_statement(schema_editor: Any) -> str:
    """A statement that does nothing, where an index of the model is absent on purpose.

    The schema editor runs whatever ``create_sql`` returns (None would run as
    the text "None"), so an index some databases do without needs a no-op.
    """
    return "DO 0" if schema_editor.connection.vendor == "mysql" else "SELECT 1"


class PartialIndex(models.Index):
    """A partial index where the database has them; nothing where it has not.

    For the indexes that only make sense partial: where the database cannot
    leave rows out (MySQL, MariaDB), another index of the table serves the
    same reads (``WherePartialMissingIndex``), and a copy of it over every
    row would be one more index each write pays for.
    """

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if schema_editor.connection.features.supports_partial_indexes:
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        return _no_statement(schema_editor)

    def remove_sql(self, model: Any, schema_editor: Any, **kwargs: Any) -> Any:
        if schema_editor.connection.features.supports_partial_indexes:
            return super().remove_sql(model, schema_editor, **kwargs)
        return _no_statement(schema_editor)


class PartialWherePossibleIndex(models.Index):
    """A partial index where the database has them, else over every row.

    For an index whose reads name only the rows of its condition, but that
    MySQL and MariaDB still need over every row (no other index serves them).
    """

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if schema_editor.connection.features.supports_partial_indexes:
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        plain = models.Index(fields=self.fields, name=self.name)
        return plain.create_sql(model, schema_editor, using=using, **kwargs)


class WherePartialMissingIndex(StatusIndex):
    """A ``StatusIndex`` only where partial indexes are missing (MySQL, MariaDB).

    Where the database has partial indexes, ``PartialIndex`` ones serve its
    reads with fewer rows each, and this one is not made.
    """

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if schema_editor.connection.features.supports_partial_indexes:
            return _no_statement(schema_editor)
        return super().create_sql(model, schema_editor, using=using, **kwargs)

    def remove_sql(self, model: Any, schema_editor: Any, **kwargs: Any) -> Any:
        if schema_editor.connection.features.supports_partial_indexes:
            return _no_statement(schema_editor)
        return super().remove_sql(model, schema_editor, **kwargs)


class SearchIndex(models.Index):
    """The index behind the admin's search of a text column.

    PostgreSQL gets a trigram GIN index (``pg_trgm``, created by migration
    0003), which serves ``ILIKE '%term%'``: search by any part of the value.
    MySQL, MariaDB and SQLite get a B-tree on the column, which serves a search
    by the value's beginning (``LIKE 'term%'``): the admin searches them so.
    A ``condition`` makes it partial where the database has partial indexes.
    """

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        connection = schema_editor.connection
        condition = self.condition if connection.features.supports_partial_indexes else None
        if connection.vendor == "postgresql":
            shape = models.Index(
                fields=self.fields,
                name=self.name,
                condition=condition,
                opclasses=["gin_trgm_ops"] * len(self.fields),
            )
            return shape.create_sql(model, schema_editor, using=" USING gin", **kwargs)
        plain = models.Index(fields=self.fields, name=self.name, condition=condition)
        return plain.create_sql(model, schema_editor, using=using, **kwargs)


class TaskQuerySet(models.QuerySet["Task"]):
    def ready(self) -> TaskQuerySet:
        """READY, spelled as its indexes are (``ready_conditions``): an OR of their conditions."""
        arms = ready_conditions(self.db)
        return self.filter(functools.reduce(operator.or_, arms[1:], arms[0]))

    def runnable(self) -> TaskQuerySet:
        """READY and due by the database clock."""
        return self.ready().filter(run_after__lte=DbNow())

    def expired(self) -> TaskQuerySet:
        """RUNNING, but the holder's lease has run out: anyone may claim it."""
        return self.filter(status=TaskStatus.RUNNING, lease_expires_at__lte=DbNow())

    def claimable(self) -> TaskQuerySet:
        return self.filter(
            Q(status=TaskStatus.READY, run_after__lte=DbNow())
            | Q(status=TaskStatus.RUNNING, lease_expires_at__lte=DbNow())
        )

    def among(self, ids: Iterable[Any], status: TaskStatus) -> TaskQuerySet:
        """The rows of these ids still in ``status``, reached by primary key.

        The status test is a CASE: no partial index's predicate follows from
        it, so the planner cannot prefer a scan of every row in ``status``
        (which the statistics may call tiny while a backlog has built).
        """
        matches = Case(When(status=status, then=Value(1)), default=Value(0))
        return self.filter(pk__in=list(ids)).alias(in_status=matches).filter(in_status=1)

    def unstarted_among(self, ids: Iterable[Any]) -> TaskQuerySet:
        """The rows of these ids that never started: READY or WAITING, never claimed.

        A READY row with a ``started_at`` is between attempts (a retry, a
        handover): it started. Reached by primary key, as ``among``.
        """
        waiting = Case(
            When(status__in=[TaskStatus.READY, TaskStatus.WAITING], then=Value(1)),
            default=Value(0),
        )
        return (
            self.filter(pk__in=list(ids), started_at__isnull=True)
            .alias(unstarted=waiting)
            .filter(unstarted=1)
        )

    def in_queues(self, queue_names: Iterable[str]) -> TaskQuerySet:
        return self.filter(queue_name__in=list(queue_names))

    def held_by(self, worker_id: str) -> TaskQuerySet:
        return self.filter(status=TaskStatus.RUNNING, worker_id=worker_id)

    def requeue(self) -> int:
        """FAILED, CANCELLED or READY tasks back to READY now, with fresh attempts.

        The history of earlier attempts is kept. Returns how many changed.
        On PostgreSQL a finished row is first moved back from the table of
        finished rows (db/postgresql/finished.py), in the same transaction.
        """
        rows = self.filter(status__in=[TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.READY])
        connection = connections[self.db]
        if connection.vendor != "postgresql":
            return self._requeue(rows)
        with transaction.atomic(using=self.db), connection.cursor() as cursor:
            columns = moved_columns(cursor, self.model._meta.db_table)
            if columns is None:
                return self._requeue(rows)
            # Locked first, then moved back and changed by id: a row that ends
            # (and moves) meanwhile is not among them, so the UPDATE can never
            # meet a moved row it did not move back (the CHECK would refuse it).
            ids = list(rows.select_for_update().order_by("pk").values_list("pk", flat=True))
            if not ids:
                return 0
            table = connection.ops.quote_name(self.model._meta.db_table)
            cursor.execute(move_back_sql(table, columns, "SELECT unnest(%s::uuid[])"), [ids])
            return self._requeue(self.model._default_manager.using(self.db).filter(pk__in=ids))

    @staticmethod
    def _requeue(rows: TaskQuerySet) -> int:
        return rows.update(
            status=TaskStatus.READY,
            attempts=0,
            run_after=DbNow(),
            finished_at=None,
            worker_id="",
            cancel_requested=False,
            version=F("version") + 1,
        )

    def finished(self) -> TaskQuerySet:
        return self.filter(status__in=TaskStatus.finished())

    def unfinished(self) -> TaskQuerySet:
        """READY, RUNNING or WAITING: each arm the condition of a partial index.

        So the database reads the few unfinished rows off those indexes
        (a bitmap OR on PostgreSQL) rather than every row of the table.
        """
        return self.filter(unfinished_rows())

    def task_paths(self) -> list[str]:
        """The table's distinct task paths, read off their indexes, sorted.

        A loose index scan of ``rdbtasks_task_finished_path``: one look-up of
        the next path per distinct path, so its cost grows with the number of
        a project's tasks, not with the number of rows. Where that index holds
        only finished rows, the paths of the unfinished ones come from their
        own indexes, read first: a task that finishes meanwhile is then in the
        index read after (the other way round, a task alone on its path could
        be in neither read). That read grows with the backlog. Ignores this
        queryset's filters: it reads the whole table. (A recursive query would
        make the scan one statement, but MySQL and MariaDB scan the whole
        index for each of its steps.)
        """
        tasks = self.model._default_manager.using(self.db)
        paths: set[str] = set()
        partial = connections[self.db].features.supports_partial_indexes
        if partial:
            unfinished = tasks.unfinished().order_by().values_list("task_path", flat=True)
            paths.update(unfinished.distinct())
        rows = (
            (tasks.filter(status__in=FINISHED) if partial else tasks)
            .order_by("task_path")
            .values_list("task_path", flat=True)
        )
        path = rows.first()
        while path is not None:
            paths.add(path)
            path = rows.filter(task_path__gt=path).first()
        return sorted(paths)


def task_path_in(paths: Iterable[str]) -> Q:
    """The rows of these task paths: finished ones off the path index, the rest
    off the READY, RUNNING and WAITING indexes (``unfinished``'s arms), so no
    read walks the finished rows where the path index holds only those. (The
    unfinished arms read every unfinished row: their cost grows with the
    backlog, not with the table.)"""
    named = Q(task_path__in=list(paths))
    return (named & Q(status__in=FINISHED)) | (named & unfinished_rows())


class Task(models.Model):
    """One enqueued task: its arguments, its claim and lease, and its outcome."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    task_path = models.CharField(_("task"), max_length=255)
    queue_name = models.CharField(_("queue"), max_length=100, default="default")
    backend_name = models.CharField(_("backend"), max_length=100, default="default")
    priority = models.SmallIntegerField(default=0)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)

    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.READY)
    #: Bumped by every change of state; a claim and every later write of its
    #: holder are conditional on it (optimistic locking and fencing).
    version = models.PositiveBigIntegerField(default=0)
    worker_id = models.CharField(_("worker"), max_length=100, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=1)

    enqueued_at = models.DateTimeField(db_default=DbNow())
    run_after = models.DateTimeField(db_default=DbNow())
    #: The ``run_after`` the producer asked for; NULL when the task was not
    #: deferred. ``run_after`` itself moves with every retry's backoff.
    requested_run_after = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    return_value = models.JSONField(null=True, blank=True)
    #: One entry per finished attempt: worker, start, end, outcome and error.
    history = models.JSONField(default=list, blank=True)

    #: Asked to stop (cancel) while RUNNING; the worker tells the task through
    #: its context and ends it CANCELLED when it returns.
    cancel_requested = models.BooleanField(default=False, db_default=False)
    #: Reported by the task: fraction done (0 to 1) and a short message.
    progress = models.FloatField(null=True, blank=True)
    progress_message = models.CharField(max_length=200, blank=True, default="", db_default="")
    #: Saved by the task; handed back to the next attempt so it can resume.
    checkpoint = models.JSONField(null=True, blank=True)
    #: Parents (``depends_on``) that have not succeeded yet, while WAITING.
    waiting_on = models.PositiveIntegerField(default=0, db_default=0)
    #: What a failed parent does to this task: CANCELLED or FAILED.
    on_parent_failure = models.CharField(
        max_length=16,
        default=TaskStatus.CANCELLED,
        db_default=TaskStatus.CANCELLED.value,
        blank=True,
    )
    #: Set (with a row lock) when a dependant is enqueued, so the parent's
    #: completion knows, in its own statement, to release its children; set
    #: too on every task of a workflow with compensations, whose completion
    #: moves the workflow on (``sagas.py``).
    has_children = models.BooleanField(default=False, db_default=False)
    parents = models.ManyToManyField(
        "self",
        through="TaskDependency",
        symmetrical=False,
        related_name="children",
        blank=True,
    )

    #: The Job that enqueued this task, if any: its JobRecord follows the task.
    job_name = models.CharField(max_length=200, blank=True, default="")
    #: "At most one active task for this key": the database enforces it through
    #: ``active_dedup_key``, which is the key while READY or RUNNING, else NULL.
    dedup_key = models.CharField(  # noqa: DJ001 - NULL is "no key": unique indexes skip it
        max_length=255, null=True, blank=True
    )
    active_dedup_key = models.GeneratedField(
        expression=Case(
            When(status__in=list(TaskStatus.active()), then=F("dedup_key")),
            default=Value(None),
            output_field=models.CharField(max_length=255, null=True),
        ),
        output_field=models.CharField(max_length=255, null=True),
        db_persist=True,
    )
    #: The trace context of the span that enqueued it (W3C ``traceparent`` and
    #: ``tracestate``, as the OpenTelemetry propagator writes them), so the
    #: worker's span links to it; NULL when nothing was being traced.
    trace_context = models.JSONField(null=True, blank=True, editable=False)
    #: The cluster-wide limit the claim holds this task to (``limits.py``):
    #: its key (``LimitSlot.key``), how many slots the key has, and for a rate
    #: limit the period in seconds (0: a concurrency limit). NULL: no limit.
    limit_key = models.CharField(  # noqa: DJ001 - NULL is "no limit"
        max_length=200, null=True, blank=True, editable=False
    )
    limit_count = models.PositiveIntegerField(null=True, blank=True, editable=False)
    limit_period = models.FloatField(null=True, blank=True, editable=False)

    objects = TaskQuerySet.as_manager()

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        permissions = [
            ("retry_task", _("Can retry or requeue tasks")),
            ("cancel_task", _("Can cancel tasks")),
        ]
        indexes = [
            # READY rows, read by the claim in its order, one queue at a time
            # (docs/claim-protocol.md, "Indexes"). Rows without a limit and rows
            # with one are apart, so a full key's backlog is never walked to
            # reach the others; the limited rows are read in the claim's order
            # (``ready_limited``) and key by key (``ready_key``). Rows without
            # a limit are apart again: those enqueued to run at once, added at
            # the index's right edge, and those due at a later time, which
            # would otherwise lie to the right of every new row.
            PartialIndex(
                fields=index_fields("queue_name"),
                condition=READY_FRESH,
                name="rdbtasks_task_ready_fresh",
            ),
            PartialIndex(
                fields=index_fields("queue_name"),
                condition=READY_DEFERRED,
                name="rdbtasks_task_ready_deferred",
            ),
            PartialIndex(
                fields=index_fields("queue_name"),
                condition=READY_LIMITED,
                name="rdbtasks_task_ready_limited",
            ),
            # On MySQL and MariaDB ``status, queue_name, limit_key, ...``: the
            # unlimited rows are the range of ``limit_key IS NULL`` (a ref
            # access), each key's rows the range of its value.
            StatusIndex(
                fields=index_fields("queue_name", "limit_key"),
                condition=Q(status=TaskStatus.READY, limit_key__isnull=False),
                name="rdbtasks_task_ready_key",
            ),
            # MySQL and MariaDB: every READY row in the claim's order (the
            # two partial indexes above are not made there).
            WherePartialMissingIndex(
                fields=index_fields("queue_name"),
                condition=Q(status=TaskStatus.READY),
                name="rdbtasks_task_ready",
            ),
            # Expired leases queue by queue (the claim reads each queue's own
            # range): another queue's dead holders are never walked through.
            StatusIndex(
                fields=["queue_name", "lease_expires_at"],
                condition=Q(status=TaskStatus.RUNNING),
                name="rdbtasks_task_lease",
            ),
            # Dashboard counts of tasks waiting for their parents.
            StatusIndex(
                fields=["queue_name"],
                condition=Q(status=TaskStatus.WAITING),
                name="rdbtasks_task_waiting",
            ),
            # Throughput and failures over time, retention by age. Status and
            # queue are keys too, so the dashboard's counts per bucket of time
            # read the index alone (on PostgreSQL: an index-only scan). Only
            # finished rows: every read names a time, and the enqueue and the
            # claim of a task (two of its three writes) then add no entry.
            PartialWherePossibleIndex(
                fields=["finished_at", "status", "queue_name"],
                condition=Q(finished_at__isnull=False),
                name="rdbtasks_task_finished",
            ),
            # The admin's list of failed tasks (newest first), retry all failed, requeue.
            StatusIndex(
                fields=["id"],
                condition=Q(status=TaskStatus.FAILED),
                name="rdbtasks_task_failed",
            ),
            # The admin's search and filter by task path (``task_paths``,
            # ``task_path_in``): a B-tree, one key a row where a trigram
            # index took one per trigram. Only finished rows where the
            # database has partial indexes: the enqueue and the claim (two of
            # a task's three writes, none of them HOT on PostgreSQL) add no
            # entry, and the few unfinished rows are read off their own
            # indexes. MySQL and MariaDB update a secondary index only when
            # its key changes, so there it covers every row at no such cost.
            PartialWherePossibleIndex(
                fields=["task_path"],
                condition=Q(status__in=FINISHED),
                name="rdbtasks_task_finished_path",
            ),
            # The admin's search (see SearchIndex): a job name, a dedup key.
            SearchIndex(
                fields=["job_name"], condition=~Q(job_name=""), name="rdbtasks_task_job_search"
            ),
            SearchIndex(
                fields=["dedup_key"],
                condition=Q(dedup_key__isnull=False),
                name="rdbtasks_task_dedup_search",
            ),
        ]
        constraints = [
            NonNullUnique(fields=["active_dedup_key"], name="rdbtasks_task_one_active"),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} ({self.id})"

    @classmethod
    def check(cls, **kwargs: Any) -> list[Any]:
        messages = super().check(**kwargs)
        if all(
            isinstance(index, StatusIndex | SearchIndex | PartialIndex | PartialWherePossibleIndex)
            for index in cls._meta.indexes
            if index.condition is not None
        ):
            # MySQL and MariaDB have no partial indexes; these index classes
            # build an equivalent there, so "conditions will be ignored" is wrong.
            messages = [m for m in messages if m.id != "models.W037"]
        if all(
            isinstance(constraint, NonNullUnique)
            for constraint in cls._meta.constraints
            if getattr(constraint, "condition", None) is not None
        ):
            # The same for NonNullUnique: a plain unique constraint there.
            messages = [m for m in messages if m.id != "models.W036"]
        return messages

    @property
    def is_finished(self) -> bool:
        return self.status in TaskStatus.finished()

    @property
    def worker_ids(self) -> list[str]:
        ids = [entry.get("worker_id", "") for entry in self.history]
        if self.status == TaskStatus.RUNNING:
            ids.append(self.worker_id)
        return ids

    @property
    def errors(self) -> list[dict]:
        return [entry for entry in self.history if entry.get("exception_class_path")]


class Dashboard(Task):
    """The admin's dashboard, as an entry of the app's model list (index and sidebar).

    A proxy with no table of its own: its admin page is the dashboard.
    """

    class Meta:
        proxy = True
        verbose_name = _("dashboard")
        verbose_name_plural = _("dashboard")
        default_permissions = ()


class TaskDependency(models.Model):
    """``child`` runs only after ``parent`` succeeded."""

    # No constraint in the database: on PostgreSQL a finished task's row moves
    # to a table of its own, which a foreign key would not follow
    # (db/postgresql/finished.py). Django still cascades a deletion; retention
    # deletes these rows with their tasks.
    parent = models.ForeignKey(
        Task, on_delete=models.CASCADE, related_name="+", db_constraint=False
    )
    child = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="+", db_constraint=False)

    class Meta:
        verbose_name = _("task dependency")
        verbose_name_plural = _("task dependencies")
        constraints = [
            models.UniqueConstraint(fields=["parent", "child"], name="rdbtasks_dependency_once"),
        ]

    def __str__(self) -> str:
        return f"{self.parent_id} -> {self.child_id}"
