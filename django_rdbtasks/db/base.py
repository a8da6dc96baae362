"""The claim protocol's statements in portable SQL.

Every statement is built once per connection. A subclass per database supplies
its clock, interval arithmetic and JSON append, and replaces a statement where
the database can do the same work in fewer round trips (PostgreSQL's
``RETURNING`` with ``unnest``).

Fencing: every write a worker makes about a claimed row is conditional on
``id``, ``version`` (the one its claim produced) and ``worker_id``; a row
reclaimed by anyone since then has a new version, so the write matches nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

READY, RUNNING, SUCCESSFUL, FAILED = "READY", "RUNNING", "SUCCESSFUL", "FAILED"

#: Columns a claim hands to the worker, in this order.
CLAIM_COLUMNS = (
    "id",
    "version",
    "task_path",
    "args",
    "kwargs",
    "attempts",
    "max_attempts",
    "queue_name",
    "backend_name",
    "priority",
    "enqueued_at",
    "started_at",
    "last_attempted_at",
    "run_after",
    "history",
    "job_name",
    "checkpoint",
)
CANDIDATE_COLUMNS = ("id", "version", "status", "worker_id", "last_attempted_at")
#: Columns an enqueue writes; the rest keep their database default (NULL).
INSERT_COLUMNS = (
    "id",
    "task_path",
    "queue_name",
    "backend_name",
    "priority",
    "args",
    "kwargs",
    "max_attempts",
    "run_after",
    "enqueued_at",
    "status",
    "version",
    "worker_id",
    "attempts",
    "history",
    "job_name",
    "dedup_key",
    "waiting_on",
    "on_parent_failure",
)


@dataclass(slots=True)
class NewTask:
    """A row to insert, its arguments already JSON text."""

    id: uuid.UUID
    task_path: str
    queue_name: str
    backend_name: str
    priority: int
    args_json: str
    kwargs_json: str
    max_attempts: int
    run_after: dt.datetime | None
    job_name: str = ""
    dedup_key: str | None = None
    status: str = READY
    waiting_on: int = 0
    on_parent_failure: str = "CANCELLED"


@dataclass(slots=True)
class Candidate:
    id: Any
    version: int
    status: str
    worker_id: str
    last_attempted_at: dt.datetime | None


@dataclass(slots=True)
class ClaimedRow:
    id: Any  # as the database driver returns it
    version: int  # the version our claim wrote: the fence for every later write
    task_path: str
    args: list
    kwargs: dict
    attempts: int
    max_attempts: int
    queue_name: str
    backend_name: str
    priority: int
    enqueued_at: dt.datetime
    started_at: dt.datetime
    claimed_at: dt.datetime
    run_after: dt.datetime
    history: list
    job_name: str = ""
    checkpoint: Any = None
    #: Set when the claim took over a RUNNING row whose lease had expired.
    lost_from: Candidate | None = None


@dataclass(slots=True)
class Outcome:
    """What to write about one claimed row when the worker is done with it."""

    id: Any
    version: int
    kind: str  # one of the keys of Dialect.outcome_sql
    entry: dict | None = None  # appended to the row's history
    return_value: Any = None
    delay: float = 0.0  # seconds until a retry may run
    extra: dict = field(default_factory=dict)

    def entry_json(self) -> str | None:
        return None if self.entry is None else json.dumps(self.entry, default=str)

    def return_json(self) -> str | None:
        return None if self.return_value is None else json.dumps(self.return_value)


class Dialect:
    vendor = ""
    #: The database clock, in the form the DateTimeField columns store.
    now_sql = "CURRENT_TIMESTAMP"
    #: A JSON text parameter where a JSON column value is expected.
    json_param = "%s"

    def __init__(self, connection: Any) -> None:
        from ..models import Task

        self.connection = connection
        qn = connection.ops.quote_name
        self.table = qn(Task._meta.db_table)
        self._pk_field = Task._meta.pk
        self._claim_cols = ", ".join(CLAIM_COLUMNS)
        self._cand_cols = ", ".join(CANDIDATE_COLUMNS)
        now = self.now_sql
        self.claimable_sql = (
            f"((status = '{READY}' AND run_after <= {now}) OR "
            f"(status = '{RUNNING}' AND lease_expires_at <= {now}))"
        )
        append = self.json_append_sql("history", "%s")
        common = "version = version + 1, lease_expires_at = NULL"
        fence = f"WHERE id = %s AND version = %s AND worker_id = %s AND status = '{RUNNING}'"
        # Param order for each: the SET params, then id, version, worker_id.
        self.outcome_sql = {
            "success": (
                f"UPDATE {self.table} SET status = '{SUCCESSFUL}', {common}, "
                f"return_value = %s, finished_at = {now}, history = {append} {fence}"
            ),
            "failure": (
                f"UPDATE {self.table} SET status = '{FAILED}', {common}, "
                f"finished_at = {now}, history = {append} {fence}"
            ),
            "retry": (
                f"UPDATE {self.table} SET status = '{READY}', {common}, "
                f"run_after = {self.now_plus_sql('%s')}, worker_id = '', history = {append} {fence}"
            ),
            # Given back unfinished on shutdown: the attempt does not count.
            "release": (
                f"UPDATE {self.table} SET status = '{READY}', {common}, "
                f"attempts = attempts - 1, worker_id = '' {fence}"
            ),
            # Could not start now (a singleton already running): later, unspent.
            "postpone": (
                f"UPDATE {self.table} SET status = '{READY}', {common}, "
                f"attempts = attempts - 1, worker_id = '', run_after = {self.now_plus_sql('%s')} "
                f"{fence}"
            ),
            # The task gave itself back (or stopped early for a shutdown):
            # attempt unspent, checkpoint kept, resumable after the delay.
            "handover": (
                f"UPDATE {self.table} SET status = '{READY}', {common}, "
                f"attempts = attempts - 1, worker_id = '', run_after = {self.now_plus_sql('%s')}, "
                f"history = {append} {fence}"
            ),
            # Taken over from a lost worker but out of attempts: fail it unrun.
            "abandon": (
                f"UPDATE {self.table} SET status = '{FAILED}', {common}, "
                f"attempts = attempts - 1, finished_at = {now}, history = {append} {fence}"
            ),
            # An operator cancelled it while it ran; it has stopped.
            "cancelled": (
                f"UPDATE {self.table} SET status = 'CANCELLED', {common}, "
                f"finished_at = {now}, history = {append} {fence}"
            ),
            # Record the lost attempt's history entry and keep the claim.
            "note": f"UPDATE {self.table} SET history = {append} {fence}",
        }

    # -- pieces each database spells its own way -------------------------------------

    def now_plus_sql(self, placeholder: str) -> str:
        raise NotImplementedError

    def seconds_param(self, seconds: float) -> Any:
        return seconds

    def json_append_sql(self, column: str, placeholder: str) -> str:
        """SQL for ``column`` with the JSON object in ``placeholder`` appended."""
        raise NotImplementedError

    def encode_id(self, value: uuid.UUID) -> Any:
        return self._pk_field.get_db_prep_value(value, self.connection)

    def decode_id(self, value: Any) -> uuid.UUID:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))

    def decode_json(self, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str | bytes) else value

    def decode_dt(self, value: Any) -> dt.datetime | None:
        if value is None or (isinstance(value, dt.datetime) and value.tzinfo is not None):
            return value
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        return value.replace(tzinfo=dt.UTC)

    # -- the protocol ------------------------------------------------------------------

    def candidates_sql(self, queue_count: int) -> str:
        """Due rows of each queue in claim order, plus expired leases.

        One sub-select per queue so each walks its own index range in order:
        the cost stays proportional to the limit, never to the backlog.
        """
        now = self.now_sql
        cols = f"{self._cand_cols}, priority, run_after"
        parts = [
            f"SELECT * FROM (SELECT {cols} FROM {self.table} WHERE status = '{READY}' "
            f"AND queue_name = %s AND run_after <= {now} "
            f"ORDER BY priority DESC, run_after LIMIT %s) q{i}"
            for i in range(queue_count)
        ]
        marks = ", ".join(["%s"] * queue_count)
        parts.append(
            f"SELECT * FROM (SELECT {cols} FROM {self.table} WHERE status = '{RUNNING}' "
            f"AND lease_expires_at <= {now} AND queue_name IN ({marks}) "
            f"ORDER BY lease_expires_at LIMIT %s) qe"
        )
        union = " UNION ALL ".join(parts)
        return (
            f"SELECT {self._cand_cols} FROM ({union}) c ORDER BY priority DESC, run_after LIMIT %s"
        )

    def candidates(self, cursor: Any, queues: Sequence[str], limit: int) -> list[Candidate]:
        params: list[Any] = []
        for queue in queues:
            params += [queue, limit]
        params += [*queues, limit, limit]
        cursor.execute(self.candidates_sql(len(queues)), params)
        return [
            Candidate(row[0], row[1], row[2], row[3], self.decode_dt(row[4]))
            for row in cursor.fetchall()
        ]

    def locked_candidates(self, cursor: Any, queues: Sequence[str], limit: int) -> list[Candidate]:
        """Pessimistic mode: lock due rows, skipping rows other workers hold locked."""
        now = self.now_sql
        marks = ", ".join(["%s"] * len(queues))
        found: list[Candidate] = []
        for where, order in (
            (f"status = '{RUNNING}' AND lease_expires_at <= {now}", "lease_expires_at"),
            (f"status = '{READY}' AND run_after <= {now}", "priority DESC, run_after"),
        ):
            cursor.execute(
                f"SELECT {self._cand_cols} FROM {self.table} WHERE {where} "
                f"AND queue_name IN ({marks}) ORDER BY {order} LIMIT %s "
                "FOR UPDATE SKIP LOCKED",
                [*queues, limit - len(found)],
            )
            found += [
                Candidate(r[0], r[1], r[2], r[3], self.decode_dt(r[4])) for r in cursor.fetchall()
            ]
            if len(found) >= limit:
                break
        return found

    def _version_match_sql(self, count: int) -> str:
        return " OR ".join(["(id = %s AND version = %s)"] * count)

    def _set_claim_sql(self) -> str:
        now = self.now_sql
        return (
            f"status = '{RUNNING}', version = version + 1, worker_id = %s, "
            f"lease_expires_at = {self.now_plus_sql('%s')}, attempts = attempts + 1, "
            f"started_at = COALESCE(started_at, {now}), last_attempted_at = {now}"
        )

    def claim_update_sql(self, count: int) -> str:
        marks = ", ".join(["%s"] * count)
        return (
            f"UPDATE {self.table} SET {self._set_claim_sql()} "
            f"WHERE id IN ({marks}) AND {self.claimable_sql} "
            f"AND ({self._version_match_sql(count)})"
        )

    def claim_update_params(
        self, candidates: Sequence[Candidate], worker_id: str, lease: float
    ) -> list[Any]:
        params: list[Any] = [worker_id, self.seconds_param(lease)]
        params += [c.id for c in candidates]
        for c in candidates:
            params += [c.id, c.version]
        return params

    def claim(
        self, cursor: Any, candidates: Sequence[Candidate], worker_id: str, lease: float
    ) -> list[ClaimedRow]:
        """Claim the candidates still unchanged since they were read; return those won."""
        if not candidates:
            return []
        return self._claim(cursor, candidates, worker_id, lease)

    def _claim(
        self, cursor: Any, candidates: Sequence[Candidate], worker_id: str, lease: float
    ) -> list[ClaimedRow]:
        raise NotImplementedError

    def decode_claimed(self, row: Sequence[Any]) -> ClaimedRow:
        return ClaimedRow(
            id=row[0],
            version=row[1],
            task_path=row[2],
            args=self.decode_json(row[3]),
            kwargs=self.decode_json(row[4]),
            attempts=row[5],
            max_attempts=row[6],
            queue_name=row[7],
            backend_name=row[8],
            priority=row[9],
            enqueued_at=self.decode_dt(row[10]),  # type: ignore[arg-type]
            started_at=self.decode_dt(row[11]),  # type: ignore[arg-type]
            claimed_at=self.decode_dt(row[12]),  # type: ignore[arg-type]
            run_after=self.decode_dt(row[13]),  # type: ignore[arg-type]
            history=self.decode_json(row[14]) or [],
            job_name=row[15],
            checkpoint=self.decode_json(row[16]),
        )

    def renew(
        self, cursor: Any, held: Sequence[tuple[Any, int]], worker_id: str, lease: float
    ) -> tuple[set[Any], set[Any]]:
        """Extend the leases of claims still ours.

        Returns the ids we still hold, and those of them an operator asked to
        cancel.
        """
        held_ids: set[Any] = set()
        cancel: set[Any] = set()
        for chunk in _chunks(held, 500):
            marks = ", ".join(["%s"] * len(chunk))
            params: list[Any] = [self.seconds_param(lease), worker_id, *(i for i, _ in chunk)]
            for i, v in chunk:
                params += [i, v]
            cursor.execute(
                f"UPDATE {self.table} SET lease_expires_at = {self.now_plus_sql('%s')} "
                f"WHERE worker_id = %s AND status = '{RUNNING}' AND id IN ({marks}) "
                f"AND ({self._version_match_sql(len(chunk))})",
                params,
            )
            versions = dict(chunk)
            cursor.execute(
                f"SELECT id, version, cancel_requested FROM {self.table} WHERE worker_id = %s "
                f"AND status = '{RUNNING}' AND id IN ({marks})",
                [worker_id, *versions],
            )
            for task_id, version, cancel_requested in cursor.fetchall():
                if versions.get(task_id) == version:
                    held_ids.add(task_id)
                    if cancel_requested:
                        cancel.add(task_id)
        return held_ids, cancel

    def outcome_params(self, outcome: Outcome, worker_id: str) -> list[Any]:
        kind = outcome.kind
        if kind == "success":
            head = [outcome.return_json(), outcome.entry_json()]
        elif kind == "retry":
            head = [self.seconds_param(outcome.delay), outcome.entry_json()]
        elif kind == "postpone":
            head = [self.seconds_param(outcome.delay)]
        elif kind == "handover":
            head = [self.seconds_param(outcome.delay), outcome.entry_json()]
        elif kind == "release":
            head = []
        else:
            head = [outcome.entry_json()]
        return [*head, outcome.id, outcome.version, worker_id]

    def finish(
        self, cursor: Any, outcomes: Sequence[Outcome], worker_id: str
    ) -> dict[Any, bool | None]:
        """Write the outcomes, each fenced by its claim.

        Returns the ids written, each mapped to whether the task has dependants
        (None where this database cannot say in the same statement). The caller
        wraps this in one transaction, so a batch costs one commit.
        """
        written: dict[Any, bool | None] = {}
        for outcome in outcomes:
            cursor.execute(self.outcome_sql[outcome.kind], self.outcome_params(outcome, worker_id))
            if cursor.rowcount == 1:
                written[outcome.id] = None
        return written

    def end_waiting(self, cursor: Any, ids: Sequence[Any], status: str, entry_json: str) -> None:
        """End WAITING tasks whose parent failed: CANCELLED or FAILED, with the reason."""
        if not ids:
            return
        marks = ", ".join(["%s"] * len(ids))
        cursor.execute(
            f"UPDATE {self.table} SET status = %s, finished_at = {self.now_sql}, "
            f"version = version + 1, history = {self.json_append_sql('history', '%s')} "
            f"WHERE id IN ({marks}) AND status = 'WAITING'",
            [status, entry_json, *ids],
        )

    def current_time(self, cursor: Any) -> Any:
        """The database clock, as the driver returns it for a DateTimeField column."""
        cursor.execute(f"SELECT {self.now_sql}", [])
        return cursor.fetchone()[0]

    def insert_values(self, task: NewTask, now: Any) -> tuple:
        run_after = (
            now
            if task.run_after is None
            else self.connection.ops.adapt_datetimefield_value(task.run_after)
        )
        return (
            self.encode_id(task.id),
            task.task_path,
            task.queue_name,
            task.backend_name,
            task.priority,
            task.args_json,
            task.kwargs_json,
            task.max_attempts,
            run_after,
            now,
            task.status,
            0,
            "",
            0,
            "[]",
            task.job_name,
            task.dedup_key,
            task.waiting_on,
            task.on_parent_failure,
        )

    #: Whether insert_tasks is a single statement, atomic without a transaction.
    insert_is_one_statement = False

    def insert_tasks(
        self, cursor: Any, tasks: Sequence[NewTask], notify: bool = False
    ) -> dt.datetime:
        """Insert new READY rows, wake workers on commit if ``notify``.

        Returns the database time the rows were enqueued at.

        Written with plain statements rather than ``bulk_create``: preparing
        every value of every row through the ORM costs more than the insert.
        """
        now = self.current_time(cursor)
        marks = ", ".join(["%s"] * len(INSERT_COLUMNS))
        cursor.executemany(
            f"INSERT INTO {self.table} ({', '.join(INSERT_COLUMNS)}) VALUES ({marks})",
            [self.insert_values(task, now) for task in tasks],
        )
        if notify:
            self.notify(cursor, {task.queue_name for task in tasks})
        return self.decode_dt(now)  # type: ignore[return-value]

    def save_progress(
        self,
        cursor: Any,
        task_id: Any,
        version: int,
        worker_id: str,
        *,
        progress: float | None,
        message: str,
        checkpoint_json: str | None,
    ) -> bool:
        """Write a running task's progress and checkpoint, fenced by its claim."""
        cursor.execute(
            f"UPDATE {self.table} SET progress = %s, progress_message = %s, "
            f"checkpoint = COALESCE({self.json_param}, checkpoint) WHERE id = %s AND version = %s "
            f"AND worker_id = %s AND status = '{RUNNING}'",
            [progress, message[:200], checkpoint_json, task_id, version, worker_id],
        )
        return cursor.rowcount == 1

    def notify(self, cursor: Any, queue_names: Iterable[str]) -> None:
        """Wake idle workers of these queues once the transaction commits."""


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
