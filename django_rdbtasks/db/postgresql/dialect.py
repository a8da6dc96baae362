"""PostgreSQL: a whole round (finish a batch, claim the next) in one statement.

``jsonb_to_recordset`` turns the batch into rows, data-modifying CTEs write each
kind of outcome, and the claim locks its rows with ``FOR UPDATE SKIP LOCKED``,
so it never waits on a row another session holds.

The dialect runs the statements and keeps what past rounds taught it; the
statements and the rest are parts it holds, one module each: the round and the
renewals (``round.py``, the limited claim ``limited.py``), the enqueue
(``inserts.py``), the worker sessions' bounds (``sessions.py``), the table of
finished rows (``finished.py``), how values are sent (``parameters.py``) and
the worker's cursor (``cursor.py``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Collection, Sequence
from typing import Any

from ...states import ClaimMode, OutcomeKind
from ...storable import StorageLimits, may_hold_unstorable
from ..base import (
    CLAIM_COLUMNS,
    ENTRY_OVERHEAD,
    RUNNING,
    Candidate,
    ClaimedRow,
    ClaimRequest,
    Dialect,
    Exchange,
    Outcome,
    candidate_count,
)
from ..frontier import FrontierRead
from ..storable_outcomes import make_storable
from ..tables import Tables
from .channels import SLOT_CHANNEL
from .cursor import worker_cursor
from .finished import FinishedRows, insert_moved, returning_written
from .inserts import PostgreSQLInserts
from .parameters import array_literal, outcome_json, outcomes_json, parameter
from .round import OUTCOME_VALUES, ClaimForm, RoundSQL, compile_named, outcome_rows
from .sessions import PostgreSQLSessionBounds

#: Where the previous holder's columns start in a row of the exchange's answer.
_PREVIOUS = 1 + len(CLAIM_COLUMNS)
#: Where a frontier row (``r``, ``l``: round.py's ``frontier_rows``) has its queue,
#: priority and start.
_QUEUE, _PRIORITY, _START = (
    1 + CLAIM_COLUMNS.index(column) for column in ("queue_name", "priority", "run_after")
)
#: How long the claims of a set of queues keep the walk form after a round
#: last needed it (``PostgreSQLDialect.next_form``).
WALK_KEPT_SECONDS = 5.0


class PostgreSQLDialect(Dialect):
    """PostgreSQL's dialect, made of parts it holds: the enqueue (``inserts``), the
    round's and the renewals' statements (``round``), the worker sessions' bounds
    (``sessions``), the table of finished rows (``finished``)."""

    vendor = "postgresql"
    inserts_class = PostgreSQLInserts
    json_param = "%s::jsonb"
    exchange_is_one_statement = True
    row_lock_sql = "FOR NO KEY UPDATE SKIP LOCKED"  # see round.MINE
    only_sql = "ONLY "  # not the finished rows' table (finished.py)

    def __init__(
        self, connection: Any, tables: Tables, *, pinned_now: dt.datetime | None = None
    ) -> None:
        super().__init__(connection, tables, pinned_now=pinned_now)
        self.round = RoundSQL(self, self.limits)
        self.sessions = PostgreSQLSessionBounds()
        self.finished = FinishedRows(tables.task)
        self.renew_sql = compile_named(self.round.renewal(slots=True))
        # The same without the slots, for claims none of which is limited.
        self.renew_unlimited_sql = compile_named(self.round.renewal(slots=False))
        #: The round's statements, compiled, by their shape.
        self._exchange_sql: dict[tuple, tuple[str, tuple[str, ...]]] = {}
        #: The rounds the worker's cursor keeps prepared (cursor.py): the
        #: lean form's, without a slot to free. The other forms join the
        #: limit slots and group them, and are not prepared (planned at each
        #: run for their values: round.py).
        self.preparable_rounds: set[str] = set()
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        self._psycopg3 = is_psycopg3
        #: Per set of queues: the form of claim the last round found they
        #: need (round.py), which the next round starts with.
        self.claim_forms: dict[tuple[str, ...], ClaimForm] = {}
        #: Per set of queues: when (``time.monotonic``) a round last needed the walk.
        self.walked_at: dict[tuple[str, ...], float] = {}

    def encode_outcome(self, outcome: Outcome, limits: StorageLimits) -> None:
        # The round sends the outcome in one piece (``wire``): one search of it
        # says whether to look closer (Dialect.encode_outcome).
        wire = outcome_json(outcome)
        if len(wire) > limits.result + limits.error + ENTRY_OVERHEAD or may_hold_unstorable(wire):
            make_storable(outcome, limits)
            wire = outcome_json(outcome)
        outcome.wire = wire

    def forget_learnt(self) -> None:
        super().forget_learnt()
        self.claim_forms.clear()
        self.walked_at.clear()
        # Asked again, and the rounds that move rows made again with the columns then.
        self.finished.forget()
        self._exchange_sql = {key: sql for key, sql in self._exchange_sql.items() if not key[-1]}

    def accepts_writes(self, cursor: Any) -> bool:
        # A standby (what libpq's target_session_attrs=read-write asks too).
        cursor.execute("SELECT pg_is_in_recovery()")
        return not cursor.fetchone()[0]

    def replica_lag(self, cursor: Any) -> float | None:
        # A standby that replayed all it received is current, however long
        # ago the primary last committed (the replay timestamp alone would
        # make an idle primary's standby look ever further behind). NULL: it
        # has replayed nothing yet.
        cursor.execute(
            "SELECT CASE WHEN NOT pg_is_in_recovery() THEN 0 "
            "WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 "
            "ELSE GREATEST(0, EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())) END"
        )
        value = cursor.fetchone()[0]
        return None if value is None else float(value)

    def session_sql(self, lease: float) -> list[str]:
        return self.sessions.session_sql(lease)

    def transaction_sql(self, lease: float) -> list[str]:
        return self.sessions.transaction_sql(lease)

    def connection_options(self, lease: float) -> dict[str, Any]:
        return self.sessions.connection_options(lease)

    def naming_options(self, role: str, configured: dict[str, Any]) -> dict[str, Any]:
        return self.sessions.naming_options(role, configured)

    def now_plus_sql(self, placeholder: str, now: str | None = None) -> str:
        return f"({now or self.now_sql} + {placeholder} * INTERVAL '1 second')"

    def json_append_sql(self, column: str, placeholder: str) -> str:
        return f"{column} || jsonb_build_array({placeholder}::jsonb)"

    def encode_id(self, value: Any) -> Any:
        return value

    def worker_cursor(self, connection: Any, *, prepare: bool = True) -> Any:
        if not self._psycopg3:
            return connection.cursor()
        return worker_cursor(connection, self.preparable_rounds if prepare else frozenset())

    def public_id(self, raw_id: Any) -> str:
        # The worker's cursor reads ids as text already (cursor.py).
        return raw_id if type(raw_id) is str else str(raw_id)

    # -- one round: finish and claim -----------------------------------------------------

    def exchange(
        self, cursor: Any, outcomes: Sequence[Outcome], worker_id: str, request: ClaimRequest | None
    ) -> Exchange:
        """One statement: write ``outcomes`` and claim ``request.want`` more.

        Outcomes that settle dependants are written here only for tasks known
        to have none (``has_children`` is read under the row lock); the others
        come back unwritten, for the caller to finish in a transaction that
        also releases or ends their dependants.

        The claim takes the cheapest form its queues allow (round.py): lean
        while they hold no limited row, with a window of limited rows while
        that suffices, with a walk of the keys while a full key's backlog
        fills the window. A form that finds it does not suffice claims
        nothing, and the next runs at once: the claims keep their order.

        How an optimistic claim reads after it lost races: ``Dialect.read_mode``.

        A lane that ends limited tasks may ask for the hand-over form first
        (``ClaimRequest.hand_over``): their slots go to their keys' next
        tasks, and nothing else is read. If that claims fewer than wanted
        (a key with no task left), the claim in its form follows at once.
        """
        handed: Exchange | None = None
        if (
            request is not None
            and self.hands_over(request)
            and request.want <= sum(o.frees_slot for o in outcomes)
        ):
            handed, _ = self._round(
                cursor, outcomes, worker_id, request, ClaimForm.LEAN, None, handover=True
            )
            if len(handed.claimed) >= request.want:
                handed.handed_over = True
                return handed
            outcomes = ()
            request = dataclasses.replace(request, want=request.want - len(handed.claimed))
        result = self._exchange_in_form(cursor, outcomes, worker_id, request)
        if handed is not None:
            # (Added to, never replaced: a statement's writes and claims are never dropped.)
            result.written = {**handed.written, **result.written}
            result.busy |= handed.busy
            result.claimed = handed.claimed + result.claimed
            result.freed += handed.freed
            result.statements += 1
        return result

    def _exchange_in_form(
        self, cursor: Any, outcomes: Sequence[Outcome], worker_id: str, request: ClaimRequest | None
    ) -> Exchange:
        """``exchange`` in the forms of round.py, from the one its queues last needed."""
        claim = request is not None and request.want > 0
        queues = tuple(request.queues) if request is not None else ()
        form = self.claim_forms.get(queues, ClaimForm.LEAN) if claim else ClaimForm.LEAN
        mode = self.read_mode(request, queues)
        # The lean form reads from the lane's frontier (db/frontier.py); a
        # pinned clock (tests) can write rows its notifications do not cover.
        frontier = request.frontier if claim and request is not None else None
        read = (
            frontier.take(queues)
            if frontier is not None and form == ClaimForm.LEAN and not self.clock_pinned
            else None
        )
        if claim and request is not None and request.ahead and form != ClaimForm.LEAN:
            # Behind a running task, where limited rows are: the rows without
            # a limit only, in the lean form's statement (rows.ClaimRequest.ahead).
            result, raced = self._round(
                cursor, outcomes, worker_id, request, ClaimForm.LEAN, mode, ahead=True
            )
            self.note_contention(request, queues, mode, result, raced)
            result.passed_limited = True
            return result
        result, raced = self._round(cursor, outcomes, worker_id, request, form, mode, read)
        if not claim:
            return result
        assert request is not None
        if read is not None and frontier is not None:
            frontier.advance(read, result.fresh_from, result.leases_from)
        self.note_contention(request, queues, mode, result, raced)
        while True:
            # What this statement needed: a form that did not suffice claimed
            # nothing (it held), and the next runs at once.
            needed = (
                ClaimForm.WALK
                if result.walk
                else ClaimForm.WINDOW
                if result.limited
                else ClaimForm.LEAN
            )
            self.claim_forms[queues] = self.next_form(queues, needed)
            if needed <= form:
                return result
            form = needed
            rest, raced = self._round(cursor, [], worker_id, request, form, mode)
            result.statements += 1
            self.note_contention(request, queues, mode, rest, raced)
            # (Added to, never replaced: a statement's claims are never dropped.)
            result.claimed += rest.claimed
            result.contended = rest.contended
            result.missing = sorted({*result.missing, *rest.missing})
            result.limited, result.walk = rest.limited, rest.walk
            result.held, result.wait = rest.held, rest.wait

    def next_form(self, queues: tuple[str, ...], needed: ClaimForm) -> ClaimForm:
        """The form the next claim of ``queues`` starts with, after one that ``needed`` it.

        The walk form is kept for ``WALK_KEPT_SECONDS`` after a round last
        needed it: it claims what the window form would (a queue whose window
        is not filled reads its window), for a little more planning, while a
        round of the window form that finds a window filled is a statement
        spent. Full keys' backlogs come and go with each slot taken and freed,
        and the threads of a process share the form.
        """
        now = time.monotonic()
        if needed == ClaimForm.WALK:
            self.walked_at[queues] = now
        elif (
            needed == ClaimForm.WINDOW
            and now - self.walked_at.get(queues, -WALK_KEPT_SECONDS) < WALK_KEPT_SECONDS
        ):
            return ClaimForm.WALK
        return needed

    def _round(
        self,
        cursor: Any,
        outcomes: Sequence[Outcome],
        worker_id: str,
        request: ClaimRequest | None,
        form: ClaimForm,
        mode: ClaimMode | None,
        read: FrontierRead | None = None,
        ahead: bool = False,
        handover: bool = False,
    ) -> tuple[Exchange, bool]:
        """One statement; and whether its claim lost races for rows (not for slots).
        ``read``: the lean form's reads start at the lane's frontier; ``handover``:
        the hand-over form (``RoundSQL.handover``) instead of ``form``."""
        by_kind: dict[OutcomeKind, list[Outcome]] = {}
        for outcome in outcomes:
            by_kind.setdefault(outcome.kind, []).append(outcome)
        kinds = tuple(sorted(by_kind))
        claim = request is not None and request.want > 0
        ordered = sorted(outcomes, key=lambda o: o.id)
        # Only claims that may hold a slot need ``freed``: unlimited users'
        # rounds carry no slot step.
        ended = sorted(self.limits.ended(ordered))
        frees = bool(ended)
        moves = bool(kinds) and self.finished.moves(cursor)
        bounded = read is not None  # given only to a lean claim (``exchange``)
        key = (kinds, frees, claim, mode, form, bounded, ahead, handover, moves)
        compiled = self._exchange_sql.get(key)
        if compiled is None:
            moving = self.finished.columns if moves else None
            statement = (
                self.round.handover(kinds, moving)
                if handover
                else self.round.statement(kinds, frees, claim, mode, form, moving, bounded, ahead)
            )
            compiled = self._exchange_sql[key] = compile_named(statement)
            self.preparable_rounds.add(compiled[0])
        sql, names = compiled
        values: dict[str, Any] = {
            "ids": [o.id for o in ordered],
            "versions": [o.version for o in ordered],
            "worker": worker_id,
            "ended_ids": [i for i, _ in ended],
            "ended_versions": [v for _, v in ended],
        }
        for i, kind in enumerate(kinds):
            values[f"rows{i}"] = outcomes_json(sorted(by_kind[kind], key=lambda o: o.id))
        if claim:
            assert request is not None
            values.update(
                want=request.want,
                pool=candidate_count(request.want),
                finishing=[o.id for o in outcomes],
                claimer=request.worker_id,
                lease=request.lease,
                start_within=request.start_within,
            )
            values["queues"] = list(request.queues)
            if read is not None:
                for name, value in read.parameters().items():
                    values[name] = array_literal(value) if isinstance(value, list) else value
        cursor.execute(sql, [parameter(values[name]) for name in names])
        result = Exchange()
        seen = lost = 0
        for row in cursor.fetchall():
            marker = row[0]
            if marker == "c":
                claimed = self.decode_claimed(row[1:_PREVIOUS])
                previous_status, previous_worker, previous_attempt = row[_PREVIOUS:]
                if previous_status == RUNNING:
                    claimed.lost_from = Candidate(
                        claimed.id, claimed.version - 1, RUNNING, previous_worker, previous_attempt
                    )
                result.claimed.append(claimed)
            elif marker == "d":
                result.written[row[1]] = False
            elif marker == "b":
                result.busy.add(row[1])
            elif marker == "m":
                limit_key, count, period = self.decode_json(row[4])
                result.missing.append((limit_key, int(count), float(period or 0)))
            elif marker == "f":
                result.freed = int(row[2])
            elif marker == "r":
                result.fresh_from.append((row[_QUEUE], int(row[_PRIORITY]), row[_START]))
            elif marker == "l":
                result.leases_from.append((row[_QUEUE], row[_START]))
            else:
                seen = row[2]
                flags = set((row[3] or "").split(","))
                result.limited, result.walk = "limited" in flags, "walk" in flags
                result.held = "held" in flags
                details = self.decode_json(row[4]) or {}
                if details.get("wait") is not None:
                    result.wait = max(0.0, float(details["wait"]))
                lost = int(details.get("lost") or 0)
        # Runnable rows others won or hold (a lost race), or limited rows whose
        # slot another claimer took meanwhile: worth looking again soon.
        raced = claim and seen > len(result.claimed)
        result.contended = raced or (claim and lost > 0)
        return result, raced

    def finish(
        self, cursor: Any, outcomes: Sequence[Outcome], worker_id: str
    ) -> dict[Any, bool | None]:
        """Every kind in one statement, telling which written tasks have dependants."""
        by_kind: dict[OutcomeKind, list[Outcome]] = {}
        for outcome in outcomes:
            by_kind.setdefault(outcome.kind, []).append(outcome)
        written: dict[Any, bool | None] = {}
        moves = self.finished.moves(cursor)
        for kind, group in sorted(by_kind.items()):
            group.sort(key=lambda o: o.id)
            assignments = self.outcome_assignments(kind, "t", OUTCOME_VALUES)
            fence = f"t.id = c.id AND t.version = c.version AND {self.holder('t')} = %s"
            if moves and kind.ends_task:
                # As the round moves a finished row (round.py), with its dependants.
                columns = self.finished.columns
                sql = (
                    f"WITH d AS (DELETE FROM {self.table} AS t USING {outcome_rows('%s')} "
                    f"WHERE {fence} RETURNING {returning_written(columns, assignments)}), "
                    f"h AS ({insert_moved('d', columns)}) SELECT id, has_children FROM d"
                )
            else:
                sets = ", ".join(f"{column} = {value}" for column, value in assignments)
                sql = (
                    f"UPDATE {self.table} AS t SET {sets} FROM {outcome_rows('%s')} "
                    f"WHERE {fence} RETURNING t.id, t.has_children"
                )
            cursor.execute(sql, [outcomes_json(group), worker_id])
            written.update((row[0], row[1]) for row in cursor.fetchall())
        ended = [o for o in outcomes if o.id in written]
        self.limits.release(cursor, ended)
        # Tell the workers waiting for a slot of these tasks' queues (limited.py),
        # as the round does; sent at commit.
        for queue in sorted({o.row.queue_name for o in ended if o.frees_slot and o.row}):
            cursor.execute("SELECT pg_notify(%s, %s)", [SLOT_CHANNEL, queue])
        return written

    def claim_chosen(
        self, cursor: Any, chosen: Sequence[Candidate], worker_id: str, lease: float
    ) -> list[ClaimedRow]:
        cursor.execute(
            f"{self.claim_update_sql(len(chosen))} RETURNING {', '.join(CLAIM_COLUMNS)}",
            self.claim_update_params(chosen, worker_id, lease),
        )
        return [self.decode_claimed(row) for row in cursor.fetchall()]

    def renew(
        self,
        cursor: Any,
        held: Sequence[tuple[Any, int]],
        worker_id: str,
        lease: float,
        limited: Collection[Any] | None = None,
    ) -> tuple[set[Any], set[Any]]:
        ordered = sorted(held)
        ids, versions = [i for i, _ in ordered], [v for _, v in ordered]
        values = {"ids": ids, "versions": versions, "lease": lease, "worker": worker_id}
        if limited is not None and not any(i in limited for i in ids):
            sql, names = self.renew_unlimited_sql
        else:  # the slots (``slots_renewed``) too
            sql, names = self.renew_sql
        cursor.execute(sql, [parameter(values[name]) for name in names])
        # As text, as the round returns the ids it claimed, whatever the cursor.
        rows = [(self.public_id(row[0]), row[1]) for row in cursor.fetchall()]
        return {row[0] for row in rows}, {row[0] for row in rows if row[1]}
