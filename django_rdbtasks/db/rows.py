"""What the claim protocol reads and writes, as plain values (no models, no SQL)."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..states import ClaimMode, OutcomeKind, TaskStatus
from .frontier import ReadFrontier

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
    "limit_period",
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


#: What a ``Claimable`` read carries beyond the candidate's columns and the claim
#: order's (``priority``, ``run_after``): the rest of ``CLAIM_COLUMNS``.
CLAIMABLE_COLUMNS = tuple(
    c for c in CLAIM_COLUMNS if c not in CANDIDATE_COLUMNS and c not in ("priority", "run_after")
)


@dataclass(slots=True)
class Claimable(Candidate):
    """A candidate read, locked, with every column its claim returns and the
    database's time of the read: a claim that writes that time (not the clock's
    at the write) and is fenced on ``version`` changes only what the claim sets,
    so its ``ClaimedRow`` is known without reading the row back (MySQL/MariaDB,
    which have no ``UPDATE ... RETURNING``: ``Dialect.claims_from_read``)."""

    #: ``CLAIM_COLUMNS``' values as read, before the claim.
    values: tuple = ()
    #: The database's clock at the read (``now_sql``), as the driver returns it.
    read_at: Any = None

    def claimed(self) -> tuple:
        """``CLAIM_COLUMNS``' values after a claim at ``read_at``, as a read back gives them."""
        row = dict(zip(CLAIM_COLUMNS, self.values, strict=True))
        row["version"] = self.version + 1
        row["attempts"] += 1
        row["started_at"] = row["started_at"] or self.read_at
        row["last_attempted_at"] = self.read_at
        return tuple(row[c] for c in CLAIM_COLUMNS)


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
    #: The limit's period: above 0, a rate limit, whose body must start in time.
    limit_period: float | None = None
    #: Set when the claim took over a RUNNING row whose lease had expired.
    lost_from: Candidate | None = None
    #: This claim took the row over from a lost holder (still true once the
    #: lost attempt is recorded and ``lost_from`` cleared).
    taken_over: bool = False
    #: A rate-limited claim: by when (``time.monotonic``) its body must start,
    #: or be given back unstarted (``ClaimRequest.start_within``). None: no deadline.
    start_by: float | None = None


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
    #: The outcome as the round sends it, encoded ahead by the thread that ran
    #: the task (``Dialect.encode_outcome``), or None: encoded by the round.
    wire: str | None = None
    #: The history entry and the result as JSON text (``entry_json``,
    #: ``return_json``), encoded ahead where the round sends them apart.
    texts: tuple[str | None, str | None] | None = None

    @property
    def limited(self) -> bool:
        """Whether the claim may hold a limit's slot (unknown without its row: yes)."""
        return self.row is None or self.row.limit_key is not None

    @property
    def frees_slot(self) -> bool:
        """Whether writing this outcome frees a concurrency slot (a rate slot frees
        itself a period after its start; a NOTE keeps its claim)."""
        row = self.row
        return (
            self.kind != OutcomeKind.NOTE
            and row is not None
            and row.limit_key is not None
            and not row.limit_period
        )

    @property
    def job_name(self) -> str:
        """The Job whose record follows this task ('' for none)."""
        return self.row.job_name if self.row is not None else ""

    def entry_json(self) -> str | None:
        if self.texts is not None:
            return self.texts[0]
        return None if self.entry is None else json.dumps(self.entry, default=str)

    def return_json(self) -> str | None:
        if self.texts is not None:
            return self.texts[1]
        return None if self.return_value is None else json.dumps(self.return_value)

    @classmethod
    def release(cls, row: ClaimedRow) -> Outcome:
        return cls(row.id, row.version, OutcomeKind.RELEASE, row=row)


#: The least time, in seconds, a worker gives itself to start the body of a
#: rate-limited task it claims (``ClaimRequest.start_within``).
RATE_START_WITHIN = 0.1


@dataclass(slots=True, frozen=True)
class ClaimRequest:
    """Up to ``want`` runnable rows of ``queues``, leased for ``lease`` seconds."""

    queues: Sequence[str]
    want: int
    worker_id: str
    lease: float
    mode: ClaimMode = ClaimMode.OPTIMISTIC
    #: Seconds after the claim within which the worker starts a rate-limited
    #: row's body, or gives it back unstarted. Its rate slot comes free a
    #: period *and this* after the claim, so two bodies started on one slot
    #: start a period apart at least, however late within it each started:
    #: the limit holds on the starts, not only on the claims (docs/limits.md).
    start_within: float = RATE_START_WITHIN
    #: The lane's read frontier (PostgreSQL, a worker that listens; db/frontier.py):
    #: the lean claim reads its fresh rows and expired leases from there.
    frontier: ReadFrontier | None = None
    #: Claimed behind a running task: rows without a limit only. A limited row
    #: claimed ahead would hold its key's slot while it waits behind a body.
    ahead: bool = False
    #: The round ends limited claims, and may hand their slots to their keys'
    #: next tasks before anything else (PostgreSQL: ``RoundSQL.handover``):
    #: the lane claimed in order within ``HAND_OVER_WITHIN`` (worker/lanes.py).
    hand_over: bool = False


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
    #: Limit keys whose slots are missing (a new key, a raised limit, slots
    #: deleted), as ``(key, count, period)``: the worker makes them after the
    #: round, in a statement of its own (``LimitSQL.make_slots``).
    missing: list[tuple[str, int, float]] = field(default_factory=list)
    #: What the claim found of limited rows (PostgreSQL, postgresql/round.py): some
    #: are in its queues; a full key's backlog fills a queue's window of them.
    limited: bool = False
    walk: bool = False
    #: Runnable rows were left READY because their keys had no free slot: the
    #: worker waits for a slot to come free (a wake-up, or ``wait``), not a poll.
    held: bool = False
    #: Seconds (database clock) until a slot of those keys comes free by time:
    #: a rate window's end, a lapsing lease. None: none will on its own.
    wait: float | None = None
    #: Statements the claim ran (PostgreSQL: a form that did not suffice, then the next).
    statements: int = 1
    #: Concurrency slots the round's outcomes freed and its claim did not take
    #: back (PostgreSQL: those whose keys have READY rows waiting): the worker
    #: wakes as many waiting claimers (PostgreSQL tells every process: postgresql/limited.py).
    freed: int = 0
    #: Where a bounded claim's next read may start (db/frontier.py): per queue
    #: and priority for the fresh rows, per queue for the expired leases.
    fresh_from: list[tuple[str, int, dt.datetime]] = field(default_factory=list)
    leases_from: list[tuple[str, dt.datetime]] = field(default_factory=list)
    #: A claim ahead (``ClaimRequest.ahead``) took rows without a limit only where
    #: its queues hold limited rows: it may have passed over some with a free slot.
    passed_limited: bool = False
    #: The claim was the hand-over alone (``ClaimRequest.hand_over``): its keys'
    #: next tasks, nothing else read, so not a claim in order.
    handed_over: bool = False


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


_EMPTY_JSON: dict[Any, Any] = {
    "[]": list,
    "{}": dict,
    "null": lambda: None,
    b"[]": list,
    b"{}": dict,
    b"null": lambda: None,
}


@dataclass(slots=True)
class NewBatch:
    """Many new rows of one task (a bulk enqueue): what they share once, the rest per row.

    Such rows differ only in their ids and arguments, so they are kept as
    lists rather than as a ``NewTask`` each, which would cost the batch more
    than the database's insert of it. Rows with a dedup key or a limit go in
    as ``NewTask``s.
    """

    task_path: str
    queue_name: str
    backend_name: str
    priority: int
    max_attempts: int
    #: As ``NewTask.run_after``: the same for every row of a task.
    run_after: dt.datetime | None
    #: Per row, in order: its id (a UUID's text, ``new_ids``), its arguments
    #: and keyword arguments as JSON text (``arguments.encode_arguments_and_values``).
    ids: list[str]
    args_json: list[str]
    kwargs_json: list[str]
    #: The enqueuer's trace context, JSON text, for every row (``observability.tracing``).
    trace_context: str | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def row(self, index: int) -> NewTask:
        """One of the rows as a ``NewTask``."""
        return NewTask(
            id=uuid.UUID(self.ids[index]),
            task_path=self.task_path,
            queue_name=self.queue_name,
            backend_name=self.backend_name,
            priority=self.priority,
            args_json=self.args_json[index],
            kwargs_json=self.kwargs_json[index],
            max_attempts=self.max_attempts,
            run_after=self.run_after,
            trace_context=self.trace_context,
        )

    def rows(self) -> list[NewTask]:
        """The rows one object each, for the statements that take them so."""
        return [self.row(index) for index in range(len(self.ids))]


#: The variant nibble of an RFC 9562 UUID (binary ``10xx``) for any hex digit.
_VARIANT = dict(zip("0123456789abcdef", "89ab" * 4, strict=True))


def new_ids(count: int) -> list[str]:
    """``count`` time-ordered UUIDs (version 7) as text, as ``str(models.uuid7())`` spells them.

    The ids of one bulk enqueue: the same millisecond for all, 74 random bits
    each; made as text from one read of the random source, about a fifth of
    what ``uuid7()`` and ``str()`` cost per id.
    """
    millis = time.time_ns() // 1_000_000
    head = f"{millis >> 16 & 0xFFFFFFFF:08x}-{millis & 0xFFFF:04x}-7"
    # 20 hex digits a row, 19 used: 3 of rand_a, then rand_b: one digit for the
    # two random bits beside the variant, 15 more.
    digits = os.urandom(10 * count).hex()
    variant = _VARIANT
    return [
        f"{head}{digits[i : i + 3]}-{variant[digits[i + 3]]}{digits[i + 4 : i + 7]}-"
        f"{digits[i + 7 : i + 19]}"
        for i in range(0, 20 * count, 20)
    ]


class RowDecoding:
    """Rows as the drivers return them, into the values above (every dialect's)."""

    def decode_id(self, value: Any) -> uuid.UUID:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))

    def decode_json(self, value: Any) -> Any:
        if not isinstance(value, str | bytes):
            return value
        # Most rows' arguments and histories: a fresh object each time, since
        # the caller may change it.
        empty = _EMPTY_JSON.get(value)
        return empty() if empty is not None else json.loads(value)

    def decode_dt(self, value: Any) -> dt.datetime | None:
        if value is None or (isinstance(value, dt.datetime) and value.tzinfo is not None):
            return value
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        return value.replace(tzinfo=dt.UTC)

    def decode_candidate(self, row: Sequence[Any]) -> Candidate:
        return Candidate(row[0], row[1], row[2], row[3], self.decode_dt(row[4]), *row[5:8])

    def decode_claimed(self, row: Sequence[Any]) -> ClaimedRow:
        # A round decodes a hundred of these: the common values (aware
        # datetimes, empty JSON, NULL) are handled inline, not by a call each.
        (
            id_,
            version,
            task_path,
            args,
            kwargs,
            attempts,
            max_attempts,
            queue_name,
            backend_name,
            priority,
            enqueued_at,
            started_at,
            claimed_at,
            run_after,
            history,
            job_name,
            checkpoint,
            requested_run_after,
            trace_context,
            limit_key,
            limit_period,
        ) = row
        decode_json, decode_dt, empty = self.decode_json, self.decode_dt, _EMPTY_JSON.get
        aware = _aware
        return ClaimedRow(
            id_,
            version,
            task_path,
            e() if (e := empty(args)) is not None else decode_json(args),
            e() if (e := empty(kwargs)) is not None else decode_json(kwargs),
            attempts,
            max_attempts,
            queue_name,
            backend_name,
            priority,
            enqueued_at if aware(enqueued_at) else decode_dt(enqueued_at),  # type: ignore[arg-type]
            started_at if aware(started_at) else decode_dt(started_at),  # type: ignore[arg-type]
            claimed_at if aware(claimed_at) else decode_dt(claimed_at),  # type: ignore[arg-type]
            run_after if aware(run_after) else decode_dt(run_after),  # type: ignore[arg-type]
            e() if (e := empty(history)) is not None else decode_json(history) or [],
            job_name,
            None if checkpoint is None else decode_json(checkpoint),
            None if requested_run_after is None else decode_dt(requested_run_after),
            None if trace_context is None else decode_json(trace_context),
            limit_key,
            limit_period,
        )


def _aware(value: Any) -> bool:
    return type(value) is dt.datetime and value.tzinfo is not None
