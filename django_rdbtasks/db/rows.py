"""What the claim protocol reads and writes, as plain values (no models, no SQL)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..states import ClaimMode, OutcomeKind, TaskStatus

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
    "requested_run_after",
    "trace_context",
    "limit_key",
)
#: What a claim needs to know of a row before it takes it.
CANDIDATE_COLUMNS = (
    "id",
    "version",
    "status",
    "worker_id",
    "last_attempted_at",
    "limit_key",
    "limit_count",
    "limit_period",
)


@dataclass(slots=True)
class Candidate:
    id: Any
    version: int
    status: str
    worker_id: str
    last_attempted_at: dt.datetime | None
    #: The limit the claim must take a slot of (``limits.LimitSpec`` fields).
    limit_key: str | None = None
    limit_count: int | None = None
    limit_period: float | None = None

    @property
    def was_running(self) -> bool:
        """Claimed from a holder whose lease ran out, rather than READY."""
        return self.status == TaskStatus.RUNNING


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
    #: The ``run_after`` the producer asked for (None: not deferred).
    requested_run_after: dt.datetime | None = None
    #: The enqueuer's trace context (``observability.tracing``), None if untraced.
    trace_context: dict[str, str] | None = None
    #: The limit key whose slot the claim holds (None: unlimited, no slot to free).
    limit_key: str | None = None
    #: Set when the claim took over a RUNNING row whose lease had expired.
    lost_from: Candidate | None = None
    #: This claim took the row over from a lost holder (still true once the
    #: lost attempt is recorded and ``lost_from`` cleared).
    taken_over: bool = False


@dataclass(slots=True)
class Outcome:
    """What to write about one claimed row when the worker is done with it."""

    id: Any
    version: int
    kind: OutcomeKind
    entry: dict | None = None  # appended to the row's history
    return_value: Any = None
    delay: float = 0.0  # seconds until the row may run again (retry, postpone, handover)
    #: How long the attempt ran (monotonic), for the log and the job record.
    duration: float = 0.0
    error: BaseException | None = None
    #: The claimed row this is about (None only in tests of the SQL).
    row: ClaimedRow | None = None

    @property
    def limited(self) -> bool:
        """Whether the claim may hold a limit's slot (unknown without its row: yes)."""
        return self.row is None or self.row.limit_key is not None

    @property
    def job_name(self) -> str:
        """The Job whose record follows this task ('' for none)."""
        return self.row.job_name if self.row is not None else ""

    def entry_json(self) -> str | None:
        return None if self.entry is None else json.dumps(self.entry, default=str)

    def return_json(self) -> str | None:
        return None if self.return_value is None else json.dumps(self.return_value)

    @classmethod
    def release(cls, row: ClaimedRow) -> Outcome:
        return cls(row.id, row.version, OutcomeKind.RELEASE, row=row)


@dataclass(slots=True, frozen=True)
class ClaimRequest:
    """Up to ``want`` runnable rows of ``queues``, leased for ``lease`` seconds."""

    queues: Sequence[str]
    want: int
    worker_id: str
    lease: float
    mode: ClaimMode = ClaimMode.OPTIMISTIC


@dataclass(slots=True)
class Exchange:
    """The answer to one round of writing outcomes and claiming more."""

    #: Ids of the outcomes written, each mapped to whether the task has
    #: dependants to settle (None where the database could not say).
    written: dict[Any, bool | None] = field(default_factory=dict)
    claimed: list[ClaimedRow] = field(default_factory=list)
    #: Runnable rows seen but lost to other workers in this round: worth
    #: asking again at once rather than waiting for the next poll.
    contended: bool = False
    #: Outcomes left unwritten because another session holds their row locked
    #: while the claim is still ours: to be written in a later round. A locked
    #: row never makes the other outcomes, or the claim, wait.
    busy: set[Any] = field(default_factory=set)


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
    "requested_run_after",
    "trace_context",
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
    #: What the producer asked for (stored as ``requested_run_after`` too), or
    #: None: due at once, and read back as not deferred.
    run_after: dt.datetime | None
    job_name: str = ""
    dedup_key: str | None = None
    status: str = TaskStatus.READY.value
    waiting_on: int = 0
    on_parent_failure: str = TaskStatus.CANCELLED.value
    #: The enqueuer's trace context, JSON text (``observability.tracing``), or None.
    trace_context: str | None = None
    #: The cluster-wide limit the claim holds it to (``limits.LimitSpec``), or None.
    limit: Any = None


class RowDecoding:
    """Rows as the drivers return them, into the values above (every dialect's)."""

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

    def decode_candidate(self, row: Sequence[Any]) -> Candidate:
        return Candidate(row[0], row[1], row[2], row[3], self.decode_dt(row[4]), *row[5:8])

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
            requested_run_after=self.decode_dt(row[17]),
            trace_context=self.decode_json(row[18]),
            limit_key=row[19],
        )
