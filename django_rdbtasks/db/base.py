"""The claim protocol's statements in portable SQL.

Every statement is built once per connection. A subclass per database supplies
its clock, interval arithmetic and JSON append, and replaces a statement where
the database can do the same work in fewer round trips (PostgreSQL's
``RETURNING`` with ``unnest``).

Fencing: every write a worker makes about a claimed row is conditional on
``id``, ``version`` (the one its claim produced), ``worker_id`` and the row
still being RUNNING; a row reclaimed by anyone since then has a new version,
so the write matches nothing.

No claim waits on a row lock: a row another session holds locked (a frozen
worker between its UPDATE and its COMMIT, say) is skipped, as if another
worker had won it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from ..states import ClaimMode, OutcomeKind, TaskStatus
from ..storable import StorageLimits, may_hold_unstorable
from .claim_order import claim_order
from .inserts import TaskInserts
from .limits import LimitSQL
from .outcomes import OUTCOME_WRITES
from .ready_reads import ReadyReads
from .rows import (
    CANDIDATE_COLUMNS,
    CLAIM_COLUMNS,
    INSERT_COLUMNS,
    Candidate,
    ClaimedRow,
    ClaimRequest,
    Exchange,
    NewBatch,
    NewTask,
    Outcome,
)
from .spelling import Spelling
from .storable_outcomes import make_storable
from .tables import Tables

__all__ = [
    "CANDIDATE_COLUMNS",
    "CLAIM_COLUMNS",
    "INSERT_COLUMNS",
    "OUTCOME_WRITES",
    "Candidate",
    "ClaimRequest",
    "ClaimedRow",
    "Dialect",
    "Exchange",
    "NewBatch",
    "NewTask",
    "Outcome",
    "candidate_count",
]

READY, RUNNING = TaskStatus.READY.value, TaskStatus.RUNNING.value
#: How long the optimistic claims of a set of queues read with SKIP LOCKED after
#: one came back short through lost races (``Dialect.read_mode``).
LOCKED_READS_SECONDS = 5.0


def candidate_count(want: int) -> int:
    """Candidates an optimistic claim of ``want`` reads: room to lose some to others.

    Half again the batch, and at least three more: a small claim keeps the
    reserve it had at four times the batch, while a big one (hundreds, with
    no-op tasks) no longer reads, sorts and carries three rows it will not
    claim for each it will. Measured (docs/benchmarks.md, 2026-11-27): with
    four processes on one queue, four times the batch cost the server about
    a fifth more per task than half again, and filled no more rounds.
    """
    return want + max(3, want // 2)


class Dialect(Spelling):
    #: The enqueue's statements this database's dialect holds (``inserts``).
    inserts_class: type[TaskInserts] = TaskInserts
    #: Whether ``exchange`` (and ``renew``) is one statement, atomic without a transaction.
    exchange_is_one_statement = False
    #: Whether the hand-over's read takes each row whole (``Claimable``), so that
    #: its claim is not read back: where an UPDATE cannot return what it wrote.
    claims_from_read = False

    def __init__(
        self, connection: Any, tables: Tables, *, pinned_now: dt.datetime | None = None
    ) -> None:
        super().__init__(connection, tables, pinned_now=pinned_now)
        #: The enqueue: new rows, their INSERTs and their cursor.
        self.inserts = self.inserts_class(self)
        self.claimable_sql = self.claimable("")
        self.fence_sql = f"id = %s AND version = %s AND {self.holder('')} = %s"
        self.outcome_sql = {kind: self._outcome_row_sql(kind) for kind in OutcomeKind}
        self.limits = LimitSQL(self)
        self.ready = ReadyReads(self, self.limits)
        #: Per set of queues: until when (``time.monotonic``) optimistic
        #: claims read with SKIP LOCKED, since one lost races (``read_mode``).
        self.locked_reads_until: dict[tuple[str, ...], float] = {}
        #: Per set of queues: whether the last claim that read in order found
        #: limited rows there (a claim ahead then reads the others only).
        self.limited_in: dict[tuple[str, ...], bool] = {}

    def encode_outcome(self, outcome: Outcome, limits: StorageLimits) -> None:
        """Encode ``outcome`` for the round ahead, as every database stores it.

        A runner thread does it while the lane's round thread waits for the
        database. What a database would refuse is made storable first
        (``storable_outcomes.make_storable``: the texts of its history entry
        readable and bounded, a result that cannot be stored the task's
        failure); the search that says whether to look closer is all it costs
        otherwise. Here the entry and the result are encoded apart
        (``Outcome.texts``), as the statements of this dialect take them.
        """
        entry, value = outcome.entry_json(), outcome.return_json()
        if _may_be_refused(entry, value, limits):
            make_storable(outcome, limits)
            entry, value = outcome.entry_json(), outcome.return_json()
        outcome.texts = (entry, value)

    def forget_learnt(self) -> None:
        """Forget what past rounds taught the claims (their contention; PostgreSQL:
        their forms; elsewhere the keys their walks found), so that the next claim
        starts as a new process's would."""
        self.locked_reads_until.clear()
        self.limited_in.clear()
        self.ready.walked.clear()

    def reads_locked(self) -> bool:
        """Whether an optimistic claim may read with SKIP LOCKED after lost races:
        where the database locks rows, and a lock is the cluster's (not Galera's)."""
        return self.has_row_locks

    def read_mode(self, request: ClaimRequest | None, queues: tuple[str, ...]) -> ClaimMode | None:
        """How this claim reads its candidates.

        An optimistic claim that comes back short while it saw more runnable
        rows than it won lost races: the other claimers read the same first
        rows of the queue, and took them or hold them locked. For the next
        ``LOCKED_READS_SECONDS`` the claims of these queues read as the
        skip-locked mode does, skipping rows others hold as they read, so each
        claimer fills its batch from rows nobody else is taking. The claim is
        the same compare-and-set of the versions read either way; only which
        rows it tries changes.
        """
        if request is None:
            return None
        if (
            request.mode == ClaimMode.OPTIMISTIC
            and self.locked_reads_until.get(queues, 0.0) > time.monotonic()
        ):
            return ClaimMode.SKIP_LOCKED
        return request.mode

    def note_contention(
        self,
        request: ClaimRequest,
        queues: tuple[str, ...],
        mode: ClaimMode | None,
        result: Exchange,
        raced: bool,
    ) -> None:
        """An optimistic claim that lost races for rows: read with SKIP LOCKED for a while.

        (A limited row whose slot another claimer took is not such a race: the
        locked read would not have found it a slot either.)
        """
        # Only a read made optimistically can tell (read_mode): a locked read never loses.
        if (
            mode == ClaimMode.OPTIMISTIC
            and raced
            and len(result.claimed) < request.want
            and self.reads_locked()
        ):
            self.locked_reads_until[queues] = time.monotonic() + LOCKED_READS_SECONDS

    def refuses_claim_mode(self, mode: ClaimMode) -> str | None:
        """Why this database cannot claim in ``mode`` (None: it can); may query it."""
        return None

    def session_sql(self, lease: float) -> list[str]:
        """Statements that bound how long a worker's own session may wait or idle."""
        return []

    def transaction_sql(self, lease: float) -> list[str]:
        """The bounds of ``session_sql`` for one transaction only.

        Behind a transaction pooler a session is shared with other clients, so
        nothing may be SET on it; these run first in each worker transaction.
        """
        return []

    def connection_options(self, lease: float) -> dict[str, Any]:
        """Driver options for a worker's own connections (keepalives, timeouts)."""
        return {}

    def naming_options(self, role: str, configured: dict[str, Any]) -> dict[str, Any]:
        """Driver options that name a worker's session after its ``role`` where the
        server shows sessions by name, given the connection's ``configured`` options."""
        return {}

    def notify(self, cursor: Any, queue_names: Iterable[str]) -> None:
        """Wake idle workers of these queues once the transaction commits."""
        self.inserts.notify(cursor, queue_names)

    def notify_ready(self, cursor: Any, pairs: Iterable[tuple[str, int]]) -> None:
        """Wake idle workers for rows made READY, by (queue, priority) (``TaskInserts``)."""
        self.inserts.notify_ready(cursor, pairs)

    def worker_cursor(self, connection: Any, *, prepare: bool = True) -> Any:
        """A cursor for the worker's own statements on ``connection``, used in a ``with``.

        ``prepare``: whether it may keep statements prepared in the session
        (never behind a transaction pooler).
        """
        return connection.cursor()

    def public_id(self, raw_id: Any) -> str:
        """A row's id as read by this database's driver, as the task's public id."""
        return str(self.decode_id(raw_id))

    def _outcome_row_sql(self, kind: OutcomeKind) -> str:
        sets = ", ".join(f"{c} = {v}" for c, v in self.outcome_assignments(kind, "", {}))
        return f"UPDATE {self.table} SET {sets} WHERE {self.fence_sql}"

    def outcome_params(self, outcome: Outcome, worker_id: str) -> list[Any]:
        values = {
            "delay": self.seconds_param(outcome.delay),
            "entry": outcome.entry_json(),
            "return_value": outcome.return_json(),
        }
        head = [values[name] for name in self.outcome_param_names(outcome.kind)]
        return [*head, outcome.id, outcome.version, worker_id]

    # -- writing outcomes --------------------------------------------------------------

    def refuse_oversized(self, cursor: Any, sql: str, params: Sequence[Any]) -> None:
        """Raise the database's own refusal for a statement it could not take whole,
        before sending it (MySQL/MariaDB: ``max_allowed_packet``); here, nothing."""

    def lock_rows(
        self,
        cursor: Any,
        claims: Sequence[tuple[Any, int]],
        worker_id: str,
        *,
        childless: set[Any] | None = None,
    ) -> tuple[set[Any], set[Any]]:
        """Lock the rows of these claims that no other session holds: ``(locked, busy)``.

        ``locked``: the ids (as given) this transaction now holds, the only
        ones to write: writing any other would wait for the session holding
        it, and every other write of the transaction with it. ``busy``: those
        of the rest still ours, to write later; the others are lost claims.
        ``childless``: given, the locked ids whose tasks have no dependants
        (read with the lock: a dependant is added under this row's lock) are
        added to it, so that their outcomes settle nothing (``finish_locked``).
        Runs inside the caller's transaction.
        """
        if not claims or not self.has_row_locks:
            return {i for i, _ in claims}, set()
        marks = ", ".join(["%s"] * len(claims))
        columns = "id" if childless is None else "id, has_children"
        cursor.execute(
            f"SELECT {columns} FROM {self.table} WHERE id IN ({marks}) {self.row_lock_sql}",
            [i for i, _ in claims],
        )
        rows = cursor.fetchall()
        got = {self.decode_id(row[0]) for row in rows}
        locked = {i for i, _ in claims if self.decode_id(i) in got}
        if childless is not None:
            without = {self.decode_id(row[0]) for row in rows if not row[1]}
            childless.update(i for i in locked if self.decode_id(i) in without)
        rest = [(i, v) for i, v in claims if i not in locked]
        if not rest:
            return locked, set()
        # A plain read waits for no lock: which of the rest are still ours.
        cursor.execute(
            f"SELECT id, version FROM {self.table} WHERE id IN ({', '.join(['%s'] * len(rest))}) "
            f"AND {self.holder('')} = %s",
            [*(i for i, _ in rest), worker_id],
        )
        current = {self.decode_id(i): v for i, v in cursor.fetchall()}
        return locked, {i for i, v in rest if current.get(self.decode_id(i)) == v}

    def still_held(
        self, cursor: Any, claims: Sequence[tuple[Any, int]], worker_id: str
    ) -> list[tuple[Any, int]]:
        """Of claims whose rows this transaction holds locked, those still ours.

        A locking read where rows are locked, so it reads their newest
        version whatever the transaction's snapshot.
        """
        marks = ", ".join(["%s"] * len(claims))
        lock = self.row_lock_sql if self.has_row_locks else ""
        cursor.execute(
            f"SELECT id, version FROM {self.table} WHERE id IN ({marks}) "
            f"AND {self.holder('')} = %s {lock}",
            [*(i for i, _ in claims), worker_id],
        )
        current = {self.decode_id(i): v for i, v in cursor.fetchall()}
        return [(i, v) for i, v in claims if current.get(self.decode_id(i)) == v]

    def finish(
        self, cursor: Any, outcomes: Sequence[Outcome], worker_id: str
    ) -> dict[Any, bool | None]:
        """Write the outcomes, each fenced by its claim, and free the concurrency
        slots of the claims written.

        Returns the ids written, each mapped to whether the task has dependants
        (None where this database cannot say in the same statement). The caller
        wraps this in one transaction, so a batch costs one commit.
        """
        written = self.write_outcomes(cursor, outcomes, worker_id)
        self.limits.release(cursor, [o for o in outcomes if o.id in written])
        return written

    def write_outcomes(
        self, cursor: Any, outcomes: Sequence[Outcome], worker_id: str
    ) -> dict[Any, bool | None]:
        """``finish`` without freeing the slots: the caller frees or hands them over
        (``hand_over_into``) in the same transaction."""
        written: dict[Any, bool | None] = {}
        for outcome in outcomes:
            sql, params = self.outcome_sql[outcome.kind], self.outcome_params(outcome, worker_id)
            self.refuse_oversized(cursor, sql, params)
            cursor.execute(sql, params)
            if cursor.rowcount == 1:
                written[outcome.id] = None
        return written

    def finish_locked(
        self, cursor: Any, outcomes: Sequence[Outcome], worker_id: str, *, release: bool = True
    ) -> tuple[dict[Any, bool | None], set[Any]]:
        """``lock_rows`` then ``finish`` for the rows locked: ``(written, busy)``;
        without ``release``, ``write_outcomes`` (their slots kept for a hand-over).

        The outcomes of tasks the lock's read found without dependants are
        written as having none (False), so the caller's settlement of
        dependants and workflows reads nothing for them (two statements a
        round saved where the outcome's statement cannot say: ``finish``).
        """
        childless: set[Any] = set()
        claims = [(o.id, o.version) for o in outcomes]
        locked, busy = self.lock_rows(cursor, claims, worker_id, childless=childless)
        writable = [o for o in outcomes if o.id in locked]
        write = self.finish if release else self.write_outcomes
        written = write(cursor, writable, worker_id) if writable else {}
        for outcome_id in childless:
            if written.get(outcome_id, False) is None:
                written[outcome_id] = False
        return written, busy

    # -- claiming ----------------------------------------------------------------------

    def candidates_sql(self, queue_count: int) -> str:
        """The first read of runnable rows: per queue, expired leases, then READY rows.

        One sub-select per queue and kind, so each walks its own index range
        in order: the cost stays proportional to the limit, never to the
        backlog. Rows whose holder died come first whatever the backlog, so
        their tasks are running again within a lease and a poll of the death.
        The rest of the read (limits' slots, the walk of a queue's keys) is
        ``ReadyReads.read``'s.
        """
        return self.ready.first_sql([""] * queue_count)

    def candidates_params(self, queues: Sequence[str], limit: int) -> list[Any]:
        """``candidates_sql``'s parameters."""
        return self.ready.first_params(queues, limit)

    def candidates(
        self,
        cursor: Any,
        queues: Sequence[str],
        limit: int,
        found: Exchange | None = None,
    ) -> list[Candidate]:
        """Up to ``limit`` runnable rows, expired leases first, then READY by priority.

        A limited row is offered only as far as its key has free slots
        (``ready_reads.py``); what the read found of limits (keys missing
        slots, keys that held rows back) goes to ``found``.
        """
        return self.ready.read(cursor, queues, limit, report=found)

    def locked_candidates(
        self,
        cursor: Any,
        queues: Sequence[str],
        limit: int,
        found: Exchange | None = None,
    ) -> list[Candidate]:
        """``candidates``, each read locking its rows, skipping rows others hold locked."""
        return self.ready.read(cursor, queues, limit, lock=self.row_lock_sql, report=found)

    def lock_unchanged(
        self, cursor: Any, candidates: Sequence[Candidate], want: int
    ) -> list[Candidate]:
        """Of candidates read without locks, lock up to ``want`` still unchanged and claimable.

        The optimistic compare-and-set, made unable to wait: a row that
        changed lost the race, and so does a row someone holds locked (it is
        skipped, and the next candidate taken in its place).
        """
        marks = ", ".join(["%s"] * len(candidates))
        # Expired leases first: here they are the rows still RUNNING.
        order = claim_order(f"CASE WHEN status = '{RUNNING}' THEN 0 ELSE 1 END")
        cursor.execute(
            f"SELECT id, version FROM {self.table} WHERE id IN ({marks}) "
            f"AND {self.claimable_sql} "
            f"ORDER BY {order} LIMIT %s FOR UPDATE SKIP LOCKED",
            [*(c.id for c in candidates), want],
        )
        versions = dict(cursor.fetchall())
        return [c for c in candidates if versions.get(c.id) == c.version]

    def claim_update_sql(self, count: int) -> str:
        marks = ", ".join(["%s"] * count)
        matches = " OR ".join(["(id = %s AND version = %s)"] * count)
        return (
            f"UPDATE {self.table} SET {self.claim_assignments('', '%s', '%s')} "
            f"WHERE id IN ({marks}) AND {self.claimable_sql} AND ({matches})"
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
        self, cursor: Any, request: ClaimRequest, exclude: Iterable[Any] = ()
    ) -> tuple[list[ClaimedRow], bool]:
        """Claim up to ``request.want`` rows; say whether any were lost to a race.

        Runs inside the caller's transaction.
        """
        result = Exchange()
        self.claim_into(cursor, request, result, exclude)
        return result.claimed, result.contended

    def claim_into(
        self, cursor: Any, request: ClaimRequest, result: Exchange, exclude: Iterable[Any] = ()
    ) -> None:
        """``claim``, into ``result``: its claims, whether it lost races, keys missing slots."""
        excluded = set(exclude)
        # Paused queues are not read (queues.py): one look-up of a table of a
        # few rows, in the claim's transaction (PostgreSQL's round does it in
        # its statement: postgresql.limited.QUEUES).
        unpaused = self.unpaused(cursor, request.queues)
        if not unpaused:
            result.claimed = []
            return
        if len(unpaused) < len(request.queues):
            request = dataclasses.replace(request, queues=unpaused)
        queues = tuple(request.queues)
        mode = self.read_mode(request, queues)
        # More than the batch, in both modes: rows lost to others, or limited
        # rows that find no slot, leave room to fill it. (A locked read holds
        # the rows it read and does not claim until the round commits.)
        count = candidate_count(request.want)
        lock = self.row_lock_sql if mode == ClaimMode.SKIP_LOCKED else ""
        if request.ahead and self.limited_in.get(queues, False):
            # Behind a running task, where limited rows are: rows without a
            # limit only (ClaimRequest.ahead).
            read = self.ready.read_unlimited(cursor, request.queues, count, lock=lock)
            result.passed_limited = True
        else:
            if mode == ClaimMode.SKIP_LOCKED:
                read = self.locked_candidates(cursor, request.queues, count, result)
            else:
                read = self.candidates(cursor, request.queues, count, result)
            self.limited_in[queues] = (
                result.held or bool(result.missing) or any(c.limit_key is not None for c in read)
            )
        read = [c for c in read if c.id not in excluded]
        # The limited rows take their keys' free slots before the batch is cut:
        # one that finds none (its key full meanwhile) is passed over, and the
        # rows behind it, limited or not, fill the batch; it stays READY.
        usable, slots, lost = self.limits.take_in_order(cursor, read, request.want)
        if mode == ClaimMode.SKIP_LOCKED:
            chosen, raced = usable[: request.want], False
        else:
            chosen = self.lock_unchanged(cursor, usable, request.want) if usable else []
            raced = len(chosen) < min(len(usable), request.want)
        result.claimed, result.contended = [], raced or lost > 0
        self.note_contention(request, queues, mode, result, raced)
        if not chosen:
            return
        assigned = self.limits.assign(chosen, slots)
        rows = self.claim_chosen(cursor, chosen, request.worker_id, request.lease)
        self.limits.stamp(cursor, rows, chosen, assigned, request.lease, request.start_within)
        by_id = {c.id: c for c in chosen}
        for row in rows:
            previous = by_id.get(row.id)
            if previous is not None and previous.was_running:
                row.lost_from = previous
        result.claimed = rows
        result.contended = result.contended or len(rows) < len(chosen)

    def hand_over_into(
        self, cursor: Any, request: ClaimRequest, result: Exchange, outcomes: Sequence[Outcome]
    ) -> None:
        """The hand-over alone (``ClaimRequest.hand_over``), in the transaction that
        wrote ``outcomes`` (``result.written``) and kept their slots (``finish``
        without ``release``): each key's next READY task, read and locked, takes
        the slot of a claim of its key just ended, in one write of the slot
        (``LimitSQL.hand_over``: only if that claim still holds it), and is
        claimed; nothing else is read. The slots not handed over are freed
        here. Into ``result``: its claims, and ``handed_over`` if they are all
        it wanted (else the caller claims the rest in order, in the same
        transaction, the freed slots with them).
        """
        ended = [o for o in outcomes if o.id in result.written]
        givers: dict[str, list[Outcome]] = {}
        for o in ended:
            if o.frees_slot and o.row is not None and o.row.queue_name in request.queues:
                assert o.row.limit_key is not None
                givers.setdefault(o.row.limit_key, []).append(o)
        handed: set[Any] = set()
        chosen: list[Candidate] = []
        if givers:
            queues = sorted({o.row.queue_name for g in givers.values() for o in g if o.row})
            keys = [(queue, key) for key in sorted(givers) for queue in queues]
            # Locked as read, in both modes: one row a key and queue.
            lock = self.row_lock_sql if self.has_row_locks else ""
            read = self.ready.next_of_keys(cursor, keys, lock=lock, whole=self.claims_from_read)
            for candidate in read:
                waiting = givers.get(candidate.limit_key or "")
                if len(chosen) >= request.want or not waiting:
                    continue
                giver = waiting[0]
                if self.hand_over_one(cursor, (giver.id, giver.version), candidate, request):
                    waiting.pop(0)
                    handed.add(giver.id)
                    chosen.append(candidate)
        self.limits.release(cursor, [o for o in ended if o.id not in handed])
        if not chosen:
            return
        rows = self.claim_handed(cursor, chosen, request.worker_id, request.lease)
        if len(rows) < len(chosen):
            # Each row was locked by its read (SQLite: one writer), so its
            # claim holds; a slot given to one that did not is freed again.
            got = {self.decode_id(row.id) for row in rows}
            self.limits.release_claims(
                cursor, [(c.id, c.version + 1) for c in chosen if self.decode_id(c.id) not in got]
            )
        result.claimed += rows
        result.handed_over = len(rows) >= request.want

    def hand_over_one(
        self, cursor: Any, holder: tuple[Any, int], to: Candidate, request: ClaimRequest
    ) -> bool:
        """The slot of ``holder`` given to ``to`` (``LimitSQL.hand_over``), whose claim
        ``claim_handed`` then writes. Whether it was given."""
        return self.limits.hand_over(cursor, holder, to, request.lease)

    def claim_handed(
        self, cursor: Any, chosen: Sequence[Candidate], worker_id: str, lease: float
    ) -> list[ClaimedRow]:
        """The claims of the rows ``hand_over_one`` gave slots to, locked by their read."""
        return self.claim_chosen(cursor, chosen, worker_id, lease)

    def unlimited_waiting(self, cursor: Any, queues: Sequence[str]) -> bool:
        """Whether a row without a limit is runnable in ``queues`` not paused: one row
        of a claim ahead's read (``ReadyReads.read_unlimited``), nothing locked.
        Whether a lane that ends a limited task leaves its slot to those
        (worker/lanes.py, ``UnlimitedWaiting``); a paused queue's rows would have
        it give its slot up for rows no claim takes."""
        unpaused = self.unpaused(cursor, queues)
        return bool(unpaused) and bool(self.ready.read_unlimited(cursor, unpaused, 1))

    def unpaused(self, cursor: Any, queues: Sequence[str]) -> list[str]:
        """Those of ``queues`` that no operator has paused."""
        cursor.execute(f"SELECT queue_name FROM {self.paused_table}", [])
        paused = {row[0] for row in cursor.fetchall()}
        return [name for name in queues if name not in paused]

    def claim_chosen(
        self, cursor: Any, chosen: Sequence[Candidate], worker_id: str, lease: float
    ) -> list[ClaimedRow]:
        """Claim rows this transaction holds locked (or, on SQLite, the only writer sees)."""
        raise NotImplementedError

    def exchange(
        self, cursor: Any, outcomes: Sequence[Outcome], worker_id: str, request: ClaimRequest | None
    ) -> Exchange:
        """Write finished outcomes and claim the next rows, in the caller's transaction."""
        handing = self.hands_over(request)
        written, busy = self.finish_locked(cursor, outcomes, worker_id, release=not handing)
        if request is None or request.want <= 0:
            return Exchange(written, busy=busy)
        result = Exchange(written, busy=busy)
        self.claim_after(cursor, request, result, outcomes)
        return result

    @staticmethod
    def hands_over(request: ClaimRequest | None) -> bool:
        """Whether a round's claim begins with the hand-over alone (``hand_over_into``):
        its outcomes' slots are then kept, not freed, when they are written."""
        return request is not None and request.want > 0 and request.hand_over and not request.ahead

    def claim_after(
        self, cursor: Any, request: ClaimRequest, result: Exchange, outcomes: Sequence[Outcome]
    ) -> None:
        """The claim of a round that wrote ``outcomes`` (``result.written``), into
        ``result``: the hand-over alone first where the request allows it, then, for
        what that did not claim, the claim in order (``claim_into``)."""
        finishing = [o.id for o in outcomes]
        if self.hands_over(request):
            self.hand_over_into(cursor, request, result, outcomes)
            if result.handed_over:
                return
        handed = result.claimed
        if not handed:
            self.claim_into(cursor, request, result, finishing)
            return
        rest = dataclasses.replace(request, want=request.want - len(handed))
        self.claim_into(cursor, rest, result, finishing + [r.id for r in handed])
        result.claimed = handed + result.claimed

    # -- leases ------------------------------------------------------------------------

    def renew(
        self,
        cursor: Any,
        held: Sequence[tuple[Any, int]],
        worker_id: str,
        lease: float,
        limited: Collection[Any] | None = None,
    ) -> tuple[set[Any], set[Any]]:
        """Extend the leases of claims still ours, and the slots of those in ``limited``.

        ``limited``: the ids of the claims that may hold a limit's slot (None:
        any may). Returns the ids we still hold, and those of them an operator
        asked to cancel.
        """
        held_ids: set[Any] = set()
        cancel: set[Any] = set()
        for chunk in _chunks(held, 500):
            # A row another session holds locked is renewed at a later
            # heartbeat; it is still ours (read below), and the others' leases
            # do not wait for it.
            locked, _ = self.lock_rows(cursor, chunk, worker_id)
            free = [(i, v) for i, v in chunk if i in locked]
            if free:
                marks = ", ".join(["%s"] * len(free))
                matches = " OR ".join(["(id = %s AND version = %s)"] * len(free))
                params: list[Any] = [self.seconds_param(lease), worker_id, *(i for i, _ in free)]
                for i, v in free:
                    params += [i, v]
                cursor.execute(
                    f"UPDATE {self.table} SET lease_expires_at = {self.now_plus_sql('%s')} "
                    f"WHERE {self.holder('')} = %s AND id IN ({marks}) AND ({matches})",
                    params,
                )
                every = cursor.rowcount == len(free)
                slotted = [(i, v) for i, v in free if limited is None or i in limited]
                if slotted and not every:
                    # A claim lost meanwhile was not renewed: its old slot,
                    # which may still name it, must lapse with its lease.
                    slotted = self.still_held(cursor, slotted, worker_id)
                self.limits.renew(cursor, slotted, lease)
            marks = ", ".join(["%s"] * len(chunk))
            versions = dict(chunk)
            cursor.execute(
                f"SELECT id, version, cancel_requested FROM {self.table} "
                f"WHERE {self.holder('')} = %s AND id IN ({marks})",
                [worker_id, *versions],
            )
            for task_id, version, cancel_requested in cursor.fetchall():
                if versions.get(task_id) == version:
                    held_ids.add(task_id)
                    if cancel_requested:
                        cancel.add(task_id)
        return held_ids, cancel

    def end_waiting(self, cursor: Any, ids: Sequence[Any], status: str, entry_json: str) -> None:
        """End WAITING tasks whose parent failed: CANCELLED or FAILED, with the reason."""
        if not ids:
            return
        marks = ", ".join(["%s"] * len(ids))
        cursor.execute(
            f"UPDATE {self.table} SET status = %s, finished_at = {self.now_sql}, "
            f"version = version + 1, history = {self.json_append_sql('history', '%s')} "
            f"WHERE id IN ({marks}) "
            f"AND (CASE WHEN status = '{TaskStatus.WAITING.value}' THEN 1 ELSE 0 END) = 1",
            [status, entry_json, *ids],
        )

    def accepts_writes(self, cursor: Any) -> bool:
        """Whether this connection's server takes writes (after a failover, the
        old primary may be back as a standby or a replica): True unless it
        says otherwise (SQLite's file always does)."""
        return True

    def limit_hit(self, cursor: Any, refusal: BaseException) -> str | None:
        """What the server says of the limit ``refusal`` hit, for the task's error
        (None: its message says all there is)."""
        return None

    def replica_lag(self, cursor: Any) -> float | None:
        """Seconds this server's copy is behind its primary: 0 on a primary, None if unknown."""
        return None  # SQLite has no replicas

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
            f"checkpoint = COALESCE({self.json_param}, checkpoint) WHERE {self.fence_sql}",
            [progress, message[:200], checkpoint_json, task_id, version, worker_id],
        )
        return cursor.rowcount == 1


#: A history entry's fields besides its traceback: its limit is the error's plus these.
ENTRY_OVERHEAD = 4096


def _may_be_refused(entry: str | None, value: str | None, limits: StorageLimits) -> bool:
    """Whether an outcome's JSON texts may hold what a database refuses (look closer then)."""
    if value is not None and (len(value) > limits.result or may_hold_unstorable(value)):
        return True
    return entry is not None and (
        len(entry) > limits.error + ENTRY_OVERHEAD or may_hold_unstorable(entry)
    )


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
