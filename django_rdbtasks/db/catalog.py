"""Every statement the dialects build, rendered as SQL text a reviewer can read.

``render(vendor)`` gives, for one database, each statement the worker and the
backend run about tasks, named and commented, laid out by ``sqlparse``
(Django's own dependency): the PostgreSQL round in each of its claim forms and
modes, with and without outcomes; the portable claim's reads, its compare-and-
set, the outcomes' writes, renewals, progress, the slots of limits, the
enqueue's INSERTs and the sessions' bounds; on PostgreSQL also what runs
outside a round (``finish``, the finished rows' moves, retention's batch, the
migrations' statements, the cleanup report). ``docs/sql/<vendor>.sql`` holds
the rendering, and ``tests/test_sql_catalog.py`` fails when it differs from
what the code builds, so that any change to a statement shows in review as a
diff of SQL (``make sql`` writes the files again).

Statements are built with a connection wrapper that never connects (the
dialects need only its quoting and features) and rendered with fixed
placeholders; a statement a method runs on a cursor is caught by a cursor
that records instead of executing. Nothing here runs in a worker.
"""

from __future__ import annotations

import datetime as dt
import textwrap
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlparse
from django.db import models
from django.db.utils import load_backend

from ..models import Task
from ..states import ClaimMode, OutcomeKind, TaskStatus
from .dialects import DIALECTS, model_tables
from .postgresql import cleanup as pg_cleanup
from .postgresql import index_bloat as pg_index_bloat
from .postgresql import schema as pg_schema
from .postgresql.finished import FINISHED_TABLE, move_back_sql, move_finished_sql
from .postgresql.pruning import Link, delete_batch_sql
from .postgresql.round import ClaimForm
from .rows import Candidate, Claimable, ClaimedRow, ClaimRequest, NewTask, Outcome

ENGINES = {
    "postgresql": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
    "sqlite": "django.db.backends.sqlite3",
}
VENDOR_NAMES = {"postgresql": "PostgreSQL", "mysql": "MySQL/MariaDB", "sqlite": "SQLite"}
#: Fixed values for the rendering: ids, a worker, queues, a lease.
IDS = [uuid.UUID(int=1), uuid.UUID(int=2)]
WORKER = "host:1:0:abcdef"
QUEUES = ["default", "emails"]
LEASE = 30.0
AT = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Statement:
    name: str
    #: Why the statement is there, in a sentence or two.
    comment: str
    sql: str


class RecordingCursor:
    """Records what a method executes. It answers as a database where every row
    named is there and every write touches one row, so that a method goes on
    to its next statement: a read of ids gives the ids asked for (with
    ``has_children`` false where it is read too), any other read nothing, the
    clock ``AT``."""

    rowcount = 1

    def __init__(self) -> None:
        self.executed: list[str] = []
        self._answer: list[tuple[Any, ...]] = []

    def execute(self, sql: str, params: Any = ()) -> None:
        self.executed.append(sql)
        asked = [p for p in (params or []) if isinstance(p, uuid.UUID | str) and p in _ID_SET]
        if sql.startswith("SELECT id FROM"):
            self._answer = [(i,) for i in asked]
        elif sql.startswith("SELECT id, has_children FROM"):
            self._answer = [(i, False) for i in asked]
        else:
            self._answer = []

    def executemany(self, sql: str, rows: Any) -> None:
        self.executed.append(sql)

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._answer

    def fetchone(self) -> tuple[Any, ...]:
        return (AT,)


_ID_SET = set(IDS) | {str(i) for i in IDS}


def dialect(vendor: str) -> Any:
    """A dialect of ``vendor`` over a wrapper that never connects."""
    settings: dict[str, Any] = {
        "ENGINE": ENGINES[vendor],
        "NAME": "catalog",
        "USER": "",
        "PASSWORD": "",
        "HOST": "",
        "PORT": "",
        "OPTIONS": {},
        "TIME_ZONE": None,
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": False,
        "AUTOCOMMIT": True,
        "ATOMIC_REQUESTS": False,
        "TEST": {},
    }
    wrapper = load_backend(ENGINES[vendor]).DatabaseWrapper(settings, f"catalog_{vendor}")
    if vendor == "mysql":
        # What a connection would learn from the server: rendered for MariaDB,
        # the server the project is tested on (MySQL lacks two session bounds).
        wrapper.__dict__["mysql_is_mariadb"] = True
        wrapper.__dict__["mysql_version"] = (10, 11, 0)
        wrapper.__dict__["mysql_server_info"] = "10.11.0-MariaDB"
    made: Any = DIALECTS[vendor](wrapper, model_tables())
    if vendor == "mysql":
        made.max_packet = 64 * 1024 * 1024  # learnt from the server; MySQL 8's default
    return made


def _claimed() -> ClaimedRow:
    return ClaimedRow(
        id=IDS[0],
        version=1,
        task_path="app.tasks.send",
        args=[],
        kwargs={},
        attempts=1,
        max_attempts=3,
        queue_name="default",
        backend_name="default",
        priority=0,
        enqueued_at=AT,
        started_at=AT,
        claimed_at=AT,
        run_after=AT,
        history=[],
    )


def _outcome(kind: OutcomeKind) -> Outcome:
    entry = {"attempt": 1, "outcome": str(kind)}
    return Outcome(IDS[0], 1, kind, entry=entry, return_value="ok", delay=1.0, row=_claimed())


def _new_task() -> NewTask:
    return NewTask(
        id=IDS[0],
        task_path="app.tasks.send",
        queue_name="default",
        backend_name="default",
        priority=0,
        args_json="[]",
        kwargs_json="{}",
        max_attempts=3,
        run_after=None,
    )


def _recorded(call: Callable[[RecordingCursor], object]) -> list[str]:
    cursor = RecordingCursor()
    call(cursor)
    return cursor.executed


def statements(vendor: str) -> Iterator[Statement]:
    """Every statement of ``vendor``'s dialect, in the order the docs list them."""
    d = dialect(vendor)
    if vendor == "postgresql":
        yield from _postgresql(d)
    else:
        yield from _portable(d)
    yield from _common(d)


def _moved_columns(d: Any) -> dict[str, str]:
    """The columns a moved row is copied by (read from ``pg_attribute`` by a worker):
    here the model's, with the types it gives them."""
    return {
        str(field.column): str(field.db_type(d.first_connection))
        for field in Task._meta.concrete_fields
        if not isinstance(field, models.GeneratedField)
    }


def _postgresql(d: Any) -> Iterator[Statement]:
    moved = _moved_columns(d)
    for mode in ClaimMode:
        for form in ClaimForm:
            name = f"round_claim_{form.name.lower()}_{mode.value.replace('-', '_')}"
            yield Statement(
                name,
                f"A round that only claims, in the {form.name.lower()} form, {mode.value}: "
                "the outcomes' CTEs are absent, the claim's reads are per queue "
                "(postgresql/round.py's docstring says what each form reads).",
                d.round.statement((), False, True, mode, form),
            )
    yield Statement(
        "round_success_then_claim_lean_optimistic",
        "The common round: a success written and its row moved to the finished "
        "table, then the lean claim, in one statement.",
        d.round.statement(
            (OutcomeKind.SUCCESS,), False, True, ClaimMode.OPTIMISTIC, ClaimForm.LEAN, moved
        ),
    )
    for mode in ClaimMode:
        yield Statement(
            f"round_claim_lean_{mode.value.replace('-', '_')}_bounded",
            f"The lean claim, {mode.value}, read from the lane's frontier (db/frontier.py): "
            "the fresh rows per queue and priority (``fq``) and the expired leases per "
            "queue from where the last read stopped, and where the next may start "
            "(the ``r`` and ``l`` rows).",
            d.round.statement((), False, True, mode, ClaimForm.LEAN, bounded=True),
        )
    yield Statement(
        "round_success_then_claim_lean_optimistic_bounded",
        "The common round of a worker that listens: a success written and moved, "
        "then the lean claim read from the lane's frontier.",
        d.round.statement(
            (OutcomeKind.SUCCESS,),
            False,
            True,
            ClaimMode.OPTIMISTIC,
            ClaimForm.LEAN,
            moved,
            bounded=True,
        ),
    )
    yield Statement(
        "round_success_then_claim_ahead_optimistic",
        "A lane's round behind a task it still runs, where its queues hold limited "
        "rows: a success written and moved, then rows without a limit only, in the "
        "lean form's reads (a limited row claimed ahead would hold its slot idle; "
        "rows.ClaimRequest.ahead).",
        d.round.statement(
            (OutcomeKind.SUCCESS,),
            False,
            True,
            ClaimMode.OPTIMISTIC,
            ClaimForm.LEAN,
            moved,
            ahead=True,
        ),
    )
    yield Statement(
        "round_success_frees_slot_then_claim_window_optimistic",
        "A limited task's success frees its slot, which the claim of the window "
        "form may hand over to the key's next task (postgresql/limited.py).",
        d.round.statement(
            (OutcomeKind.SUCCESS,), True, True, ClaimMode.OPTIMISTIC, ClaimForm.WINDOW, moved
        ),
    )
    yield Statement(
        "round_success_then_hand_over",
        "A limited task's success, and its slot handed to its key's next task, "
        "nothing else read: what a lane that ends a limited task runs for a while "
        "after a claim in order (postgresql/limited.py, LimitedClaim.handover).",
        d.round.handover((OutcomeKind.SUCCESS,), moved),
    )
    kinds = tuple(k for k in OutcomeKind if k != OutcomeKind.NOTE)
    yield Statement(
        "round_every_outcome_no_claim",
        "Outcomes of every kind written, no claim: what a round writes when the "
        "worker wants nothing more (shutdown, claimed ahead).",
        d.round.statement(kinds, True, False, None, ClaimForm.LEAN, moved),
    )
    for name, comment, (sql, names) in (
        ("renew", "The heartbeat: leases (and slots) of the claims still ours.", d.renew_sql),
        (
            "renew_unlimited",
            "The heartbeat of a process holding no limited claim.",
            d.renew_unlimited_sql,
        ),
    ):
        yield Statement(name, f"{comment} Parameters, in order: {', '.join(names)}.", sql)
    yield Statement(
        "enqueue_one",
        "A single enqueue, prepared where the session allows (postgresql/preparing.py), "
        "with its NOTIFY.",
        d.inserts.insert_one_sql[True],
    )
    yield Statement(
        "enqueue_call",
        "A single enqueue where nothing can be prepared: the function of migration 0005.",
        d.inserts.enqueue_call_sql,
    )
    yield Statement("enqueue_many", "Many NewTask rows in one INSERT.", d.inserts.insert_sql)
    yield Statement(
        "enqueue_batch_read_back",
        "After a bulk enqueue's COPY: its clock read off its first row, and the NOTIFY.",
        d.inserts.copied_sql[True],
    )
    for i, sql in enumerate(_recorded(lambda c: d.unlimited_waiting(c, QUEUES))):
        yield Statement(
            f"unlimited_waiting_read_{i}",
            "Whether a row without a limit is runnable, read by a lane about to hand a "
            "slot over when nothing told its process for 50 ms (worker/lanes.py, "
            "UnlimitedWaiting): the portable claim ahead's read of one row per index.",
            sql,
        )
    yield from _postgresql_outside_rounds(d, moved)


def _postgresql_outside_rounds(d: Any, moved: dict[str, str]) -> Iterator[Statement]:
    """What runs on PostgreSQL outside a round: outcomes written alone, finished rows
    moved, retention's batches, the migrations' statements, the cleanup report."""
    d.finished.present, d.finished.columns = True, moved
    outcomes = [_outcome(OutcomeKind.SUCCESS), _outcome(OutcomeKind.RETRY)]
    for i, sql in enumerate(_recorded(lambda c: d.finish(c, outcomes, WORKER))):
        yield Statement(
            f"finish_{i}",
            "Outcomes written outside a round (a stopping worker, a task's own "
            "connection), one statement per kind; an ending one moves its row to the "
            "finished table as the round does.",
            sql,
        )
    quote = d.first_connection.ops.quote_name
    task_table = model_tables().task
    table = quote(task_table)
    finished = [status.value for status in TaskStatus.finished()]
    yield Statement(
        "move_finished_rows",
        "Rows finished in the task table (before the finished table existed, or by a "
        "path that does not move them) moved in batches, oldest first (finished_rows.py).",
        move_finished_sql(table, moved, [TaskStatus.SUCCESSFUL.value]),
    )
    yield Statement(
        "move_back_for_requeue",
        "A requeue's rows moved back from the finished table before it rewrites them.",
        move_back_sql(table, moved, "SELECT unnest(%s::uuid[])"),
    )
    link = Link('"app_invoice"', '"task_id"', cascade=True)
    yield Statement(
        "prune_batch",
        "Retention: one batch of old finished tasks deleted with what refers to them "
        "(here one table whose rows go with their task; retention.py finds the real "
        "ones), their candidates counted (postgresql/pruning.py).",
        delete_batch_sql(table, '"id"', [link]),
    )
    for i, sql in enumerate(
        pg_schema.create_finished_table_sql(quote, task_table, FINISHED_TABLE, finished)
    ):
        yield Statement(
            f"migration_finished_table_{i}",
            "Migration 0015: the finished rows' table, inheriting the task table.",
            sql,
        )
    yield Statement(
        "migration_task_columns",
        "A migration's list of the columns a moved row is copied by.",
        pg_schema.TASK_COLUMNS_SQL,
    )
    for i, sql in enumerate(
        pg_schema.drop_finished_table_sql(quote, task_table, FINISHED_TABLE, ["id", "status"])
    ):
        yield Statement(
            f"migration_finished_table_reversed_{i}",
            "Migration 0015 reversed: the finished rows back (every column, here two), "
            "the table dropped.",
            sql,
        )
    yield Statement(
        "migration_interrupted_index",
        "What an interrupted concurrent index build left, dropped before it is built again.",
        pg_schema.drop_interrupted_index_sql('"rdbtasks_task_ready_fresh"'),
    )
    for name in ("SESSIONS", "PREPARED", "SLOTS", "REPLICAS", "TABLES", "AUTOVACUUM", "SEES_ALL"):
        yield Statement(
            f"cleanup_{name.lower()}",
            f"rdbtasks cleanup: {name.lower().replace('_', ' ')} (postgresql/cleanup.py).",
            getattr(pg_cleanup, f"PG_{name}"),
        )
    yield from _index_rebuild()


def _index_rebuild() -> Iterator[Statement]:
    """The scheduler's rebuild of the indexes a held-back cleanup grew (index_rebuild.py)."""
    index = '"rdbtasks_task_ready_fresh"'
    for name, comment, sql in (
        (
            "rebuild_grown_indexes",
            "The task table's btree indexes many times what its live rows need.",
            pg_index_bloat.PG_GROWN_INDEXES,
        ),
        (
            "rebuild_oldest_snapshot",
            "How long the oldest transaction of another session has held back the cleanup: "
            "no rebuild while it is long.",
            pg_index_bloat.PG_OLDEST_SNAPSHOT,
        ),
        ("rebuild_index", "One grown index rebuilt.", pg_index_bloat.rebuild_sql(index)),
        (
            "rebuild_leftovers",
            "The invalid indexes a failed rebuild left behind.",
            pg_index_bloat.PG_REBUILD_LEFTOVERS,
        ),
        (
            "rebuild_drop_leftover",
            "One such leftover dropped.",
            pg_index_bloat.drop_leftover_sql('"rdbtasks_task_ready_fresh_ccnew"'),
        ),
    ):
        yield Statement(name, comment, sql)


def _portable(d: Any) -> Iterator[Statement]:
    yield Statement(
        "claim_first_read",
        "The claim's first read, for two queues: per queue, expired leases, then READY "
        "rows by priority (fresh, deferred, limited: each its index's range), one "
        "UNION ALL (ready_reads.py).",
        d.candidates_sql(len(QUEUES)),
    )
    yield Statement(
        "claim_compare_and_set",
        "The claim itself for three candidates: version + 1 where each is still at the "
        "version read (optimistic locking).",
        d.claim_update_sql(3),
    )
    for kind in OutcomeKind:
        yield Statement(
            f"outcome_{kind.value}",
            f"A {kind.value} outcome written, fenced by the claim (id, version, holder).",
            d.outcome_sql[kind],
        )
    candidate = Candidate(IDS[0], 0, TaskStatus.READY.value, "", None)
    for i, sql in enumerate(_recorded(lambda c: d.lock_unchanged(c, [candidate], 1))):
        yield Statement(
            f"claim_lock_unchanged_{i}",
            "Of the candidates read, those still at the version read, locked, skipping "
            "rows others hold (the optimistic claim never waits).",
            sql,
        )
    for i, sql in enumerate(_recorded(lambda c: d.ready.read_unlimited(c, QUEUES, 5))):
        yield Statement(
            f"claim_ahead_read_{i}",
            "A claim behind a task the lane still runs: per queue, the expired leases and "
            "READY rows without a limit, each its index's range (no slot read, no key "
            "walked; rows.ClaimRequest.ahead). Of one row, outside a round: whether such "
            "a row waits (Dialect.unlimited_waiting, worker/lanes.py UnlimitedWaiting).",
            sql,
        )
    lock = d.row_lock_sql if d.has_row_locks else ""
    for i, sql in enumerate(
        _recorded(
            lambda c: d.ready.next_of_keys(
                c, [(QUEUES[0], "concurrency:tenant:1")], lock=lock, whole=d.claims_from_read
            )
        )
    ):
        yield Statement(
            f"hand_over_next_of_key_{i}",
            "The hand-over alone (Dialect.hand_over_into): a limited task's outcome "
            "written, its key's next READY row, due, of a queue not paused, one look-up "
            "of the key's index, locked as read (MySQL/MariaDB: read whole, with the "
            "server's time, so that its claim is not read back: rows.Claimable).",
            sql,
        )
    request = ClaimRequest(QUEUES, 1, WORKER, LEASE, ClaimMode.OPTIMISTIC, hand_over=True)
    limited = Claimable(
        IDS[1], 0, TaskStatus.READY.value, "", None, "concurrency:tenant:1", 3, read_at=AT
    )
    for i, sql in enumerate(_recorded(lambda c: d.hand_over_one(c, (IDS[0], 1), limited, request))):
        yield Statement(
            f"hand_over_slot_{i}",
            "The hand-over's write: the slot of a claim whose outcome the round wrote, "
            "given to the key's next row, only if that claim still holds it and it is "
            "among the row's limit's slots (MySQL/MariaDB: and the row's claim, in the "
            "same UPDATE of both tables).",
            sql,
        )
    if d.has_row_locks:
        for i, sql in enumerate(_recorded(lambda c: d.locked_candidates(c, QUEUES, 5))):
            yield Statement(
                f"claim_first_read_skip_locked_{i}",
                "The first read in the skip-locked mode: each part locks what it reads.",
                sql,
            )
    for i, sql in enumerate(
        _recorded(lambda c: d.finish(c, [_outcome(OutcomeKind.SUCCESS)], WORKER))
    ):
        yield Statement(f"finish_{i}", "Outcomes written outside a round (finish).", sql)
    for i, sql in enumerate(_recorded(lambda c: d.inserts.insert_tasks(c, [_new_task()]))):
        yield Statement(f"enqueue_{i}", "An enqueue: the clock, then the row.", sql)
    for i, sql in enumerate(_recorded(lambda c: d.renew(c, [(IDS[0], 1)], WORKER, LEASE))):
        yield Statement(f"renew_{i}", "The heartbeat, step by step.", sql)
    for i, sql in enumerate(_recorded(lambda c: d.unpaused(c, QUEUES))):
        yield Statement(f"claim_paused_queues_{i}", "The paused queues, read by the claim.", sql)
    for i, sql in enumerate(_recorded(lambda c: d.limits.slot_state(c, {"tenant:1": 3}))):
        yield Statement(
            f"claim_slot_state_{i}",
            "The slots of the keys a window found (up to 500 keys a statement): how many "
            "exist, which are free now, when the others come free, by the database's clock.",
            sql,
        )
    yield Statement(
        "claim_walk_first_key",
        "A queue whose window full keys filled is walked: its first key with READY rows, "
        "one index descent (ready_reads.py, step 3).",
        d.ready.first_key_sql(),
    )
    yield Statement(
        "claim_walk_next_key",
        "The walk's next key after the last, one index descent a key however many rows "
        "the last holds (run in a loop: these databases run no recursive loose scan).",
        d.ready.next_key_sql(),
    )
    yield Statement(
        "claim_walk_key_rows",
        "A walked key with free slots read for as many rows as it has free (several keys "
        "are one UNION ALL of this, up to 100 a statement).",
        d.ready.key_rows_sql(),
    )
    if not d.ready.split:
        yield Statement(
            "claim_walk_unlimited_rows",
            "Where one window holds every kind (no partial indexes), a walked queue's rows "
            "without a limit, read apart.",
            d.ready.unlimited_sql(),
        )


def _common(d: Any) -> Iterator[Statement]:
    for i, sql in enumerate(
        _recorded(
            lambda c: d.save_progress(
                c, IDS[0], 1, WORKER, progress=0.5, message="half", checkpoint_json="{}"
            )
        )
    ):
        yield Statement(f"save_progress_{i}", "A running task's progress, fenced.", sql)
    for i, sql in enumerate(_recorded(lambda c: d.lock_rows(c, [(IDS[0], 1)], WORKER))):
        yield Statement(f"lock_rows_{i}", "The rows of claims about to be renewed.", sql)
    for i, sql in enumerate(
        _recorded(lambda c: d.lock_rows(c, [(IDS[0], 1)], WORKER, childless=set()))
    ):
        yield Statement(
            f"lock_outcome_rows_{i}",
            "The rows of outcomes about to be written, and whether their tasks have "
            "dependants to settle.",
            sql,
        )
    for i, sql in enumerate(_recorded(lambda c: d.limits.make_slots(c, [("tenant:1", 3, 0.0)]))):
        yield Statement(f"make_slots_{i}", "A limit key's missing slots, made.", sql)
    for i, sql in enumerate(_recorded(lambda c: d.current_time(c))):
        yield Statement(f"clock_{i}", "The database's clock.", sql)
    for i, sql in enumerate(d.session_sql(LEASE)):
        yield Statement(f"session_{i}", "A worker session's bounds, set once.", sql)
    for i, sql in enumerate(d.transaction_sql(LEASE)):
        yield Statement(
            f"transaction_{i}", "The same bounds per transaction, behind a pooler.", sql
        )


def render(vendor: str) -> str:
    """The catalog of ``vendor`` as one SQL file."""
    parts = [
        f"-- The SQL django-rdbtasks runs on {VENDOR_NAMES[vendor]}, as the code builds it.\n"
        "-- Generated by django_rdbtasks/db/catalog.py (make sql); checked by\n"
        "-- tests/test_sql_catalog.py. %s, %(name)s: parameters.\n"
    ]
    for statement in statements(vendor):
        # Laid out only: keywords and names as written (a column named like a
        # keyword, ``version``, stays as it is). A column a line, indented by
        # its depth (aligned under the keyword, a RETURNING's columns began
        # 500 columns in).
        text = sqlparse.format(statement.sql, reindent=True, indent_columns=True)
        comment = "\n".join(f"-- {line}" for line in textwrap.wrap(statement.comment, 96))
        parts.append(f"-- name: {statement.name}\n{comment}\n{text.strip()};\n")
    return "\n".join(parts)


def write_all(directory: str = "docs/sql") -> None:
    """Write ``<directory>/<vendor>.sql`` for every database (``make sql``)."""
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    for vendor in ENGINES:
        (target / f"{vendor}.sql").write_text(render(vendor))
