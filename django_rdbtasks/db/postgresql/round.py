"""PostgreSQL's round as SQL: the outcomes' CTEs, then the claim's, in one statement.

The claim comes in three forms, from the cheapest (``ClaimForm``):

- **lean**, for queues that hold no limited row: the expired leases and the
  READY rows without a limit, read in their index order, claimed. No slot
  step, no limited read. A probe (``lim``: one index descent per queue) says
  whether a READY row with a limit is there.
- **window**: the same, plus the limited rows. Per queue, the first rows with
  a limit in the claim's order are read (``la``: as many as the unlimited
  read's LIMIT) and kept as far as their key has free slots (``lr``: at most
  as many rows of a key as it has free slots); the rows then take their
  slots under the slot rows' locks (``lk``, ``sf``, ``go``, ``taken``;
  db/limits.py). ``nb`` says whether that window was full yet gave fewer rows
  than the round wants: keys whose slots are all taken fill it.
- **walk**: the window form, plus a walk of the keys for queues whose window
  is so filled: a loose index scan of the queue's keys with READY rows, one
  index descent a key (``kk``), and a read of each key that has free slots,
  for as many rows as it has (``kb``, ``rb``). A full key's backlog is never
  walked, whatever its length.

Every read is made once per queue, as a LATERAL over the queues' array, in
its index's order with a LIMIT: the statement, and its planning, are the
same for one queue or ten, and no read's cost grows with a backlog.

A form that cannot know it has the right rows claims nothing and says so
(the lean form when limited rows are there, the window form when a window is
filled), and ``PostgreSQLDialect.exchange`` runs the next form at once: the
claims keep their order (expired leases first, then priority and
``run_after``, limited or not), and only a round that changes form costs a
second statement. Every form is prepared, from its first run, with one
plan for every run (cursor.py): each of its reads of the table is one no
plan can widen to the whole table (by primary key, by location, an index's
range with a LIMIT), whatever the table held when the plan was made
(tests/test_postgresql_cursor.py makes the plans on an empty table and runs them on a
backlog). The planning, once a shape a session, grows with the form: see
docs/limits.md, "Cost".

The statement is written with named placeholders and compiled once to
positional ones (``compile_named``); ``exchange`` fills them by name.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence

from ...states import ClaimMode, OutcomeKind, TaskStatus
from ..claim_order import CLAIM_ORDER, ready_order
from ..limits import LimitSQL
from ..outcomes import SETTLES_DEPENDANTS
from ..ready_arms import DEFERRED, FRESH
from ..rows import CLAIM_COLUMNS
from ..spelling import Spelling
from .finished import insert_moved, returning_written
from .limited import QUEUES, LimitedClaim

READY, RUNNING = TaskStatus.READY.value, TaskStatus.RUNNING.value

#: The rows of a statement's outcomes (or renewals) that no other session holds
#: locked, locked now: its writes touch only these, so none of them waits.
#: NO KEY UPDATE is the lock the UPDATE itself takes (renewals; rounds that
#: move no row): it does not conflict with the KEY SHARE a foreign key's check
#: holds (a row of a user's table that refers to the task, in a transaction
#: still open), so such a row is not taken for busy. A round that moves rows
#: takes what its DELETE needs (``MOVING_LOCK``). The package's own foreign
#: keys to the task table have no constraint in the database (migration 0015).
#: The ids come as an array built in the statement (an InitPlan), not as the
#: parameter itself: the planner then cannot count them, and reaches them by
#: primary key however many a round names. Counted (hundreds, with rounds of
#: no-op tasks), they made a sequential scan of a table of tens of thousands
#: of rows look cheaper, and its cost grows with the table
#: (tests/test_db_plans.py).
MINE = (
    "mine AS MATERIALIZED (SELECT id, ctid AS at FROM {table} WHERE "
    "id = ANY(ARRAY(SELECT unnest(%(ids)s::uuid[]))) FOR {lock} SKIP LOCKED)"
)
LOCK = "NO KEY UPDATE"
#: The lock a DELETE takes, for a round that moves finished rows
#: (finished.py): taken up front and skipped if held (the row is then
#: ``busy``, and written by a later round), so that the DELETE never waits on a
#: session holding the row KEY SHARE.
MOVING_LOCK = "UPDATE"
#: The rows of the statement's outcomes (``t``): those of ``mine``, reached
#: again by where ``mine`` found and locked them (``ctid``), not through the
#: primary key. A row locked by this statement cannot move before its UPDATE,
#: and a lookup by primary key walks past an entry for each dead version of
#: the row (every write of a task adds one): about nine buffers a row against
#: one. The ids and versions are still compared. As an array the locations are
#: built once and searched in C (a semi-join against the CTE was planned as a
#: nested loop that scans ``mine`` again for every row). The renewal reads its
#: rows so; a round's outcomes join each to the location ``mine`` found it at
#: (``t.ctid = c.at``: one look-up a row, and no array to search per row).
IN_MINE = "t.ctid = ANY(ARRAY(SELECT at FROM mine))"
#: The id a written row must have, as a condition no plan can read an index
#: for: an equality with another relation's column lets a whole index scan
#: of the table be merged or hashed with it, and a plan made once (the
#: prepared lean round's, cursor.py) on a near-empty table took that
#: scan, 600,000 index entries a round once a backlog came. Ids are never
#: NULL: it is the equality. The rows are joined by where they were locked.
SAME_ID = "t.id IS NOT DISTINCT FROM {source}.id"
#: Where an outcome's values come from in ``outcome_rows``.
OUTCOME_VALUES = {"return_value": "c.rv", "entry": "c.entry", "delay": "c.delay"}
#: The ids of the claims a round is finishing (none of which it claims again),
#: as a subquery: ``NOT IN`` it is one hash, built once. ``<> ALL`` of the
#: array looks each row's id up in the array from its start, 400 ids a row
#: in a drain's round, whenever the array is a parameter (a prepared round's
#: is) rather than a constant.
FINISHING = "SELECT unnest(%(finishing)s::uuid[])"
#: What a round returns as text, though the columns are uuid and jsonb: the
#: worker's session loads these two types in Python (cursor.py), text in C,
#: and a round returns one id a task claimed and one a task written. The
#: server prints a jsonb the same way for either format.
SENT_AS_TEXT = frozenset({"id", "args", "kwargs", "history", "checkpoint", "trace_context"})
#: What a claim needs of a row (the reads add what they order it by).
_COLS = "id, version, status, worker_id, last_attempted_at, limit_key, limit_count, limit_period"
#: ``_COLS`` read off the table, with where the row is (``at``: the claim's
#: UPDATE reaches a row it locked by it, as the outcomes do, see IN_MINE).
#: The optimistic pool's unlocked reads carry it unused: ``go`` locks the
#: row and reads its own. (The limited reads' CTEs spell the same: limited.py.)
_ROW_COLS = f"{_COLS}, ctid AS at"
#: The columns of a read of the fresh rows, as the claim's reads give them.
FRONTIER_READ_COLUMNS = [*_COLS.split(", "), "at", "reclaim", "priority", "run_after"]
#: The columns of a round's answer after its marker and id: a claimed row's,
#: then what it was before (status, holder, last attempt).
ANSWER_WIDTH = len(CLAIM_COLUMNS) + 2
_NAMED = re.compile(r"%\((\w+)\)s")
#: Where a queue's (``q.name``) expired leases are read from (``lf.start``): the
#: lane's frontier (db/frontier.py), or from the head for a queue it has none of.
LEASES_FROM = (
    "SELECT COALESCE(max(a.start), '-infinity'::timestamptz) AS start FROM "
    "unnest(%(lease_queues)s::text[], %(lease_from)s::timestamptz[]) AS a(queue, start) "
    "WHERE a.queue = q.name"
)


class ClaimForm(enum.IntEnum):
    """The forms of the claim, cheapest first (see the module's docstring)."""

    LEAN = 0
    WINDOW = 1
    WALK = 2


def _per_queue(sql: str) -> str:
    """``sql`` (reading ``q.name``'s rows) for each of the claim's queues."""
    return f"SELECT r.* FROM {QUEUES} CROSS JOIN LATERAL ({sql}) AS r"


def compile_named(sql: str) -> tuple[str, tuple[str, ...]]:
    """``%(name)s`` placeholders to ``%s``, and the names in the order they came."""
    return _NAMED.sub("%s", sql), tuple(_NAMED.findall(sql))


def outcome_rows(placeholder: str) -> str:
    """The outcomes of one kind, as rows: one JSON document is far cheaper to send
    than five arrays of quoted JSON texts."""
    return (
        f"jsonb_to_recordset({placeholder}::jsonb) AS c(id uuid, version bigint, rv jsonb, "
        "entry jsonb, delay float8)"
    )


class RoundSQL:
    """Builds the statements of ``PostgreSQLDialect.exchange``."""

    def __init__(self, dialect: Spelling, limits: LimitSQL) -> None:
        self.d = dialect
        self.limits = limits
        self.t = dialect.table
        self.now = dialect.now_sql
        self.limited = LimitedClaim(
            dialect.table,
            limits.table,
            dialect.now_sql,
            limits.free,
            _COLS,
            FINISHING,
        )

    # -- outcomes ------------------------------------------------------------------------

    def busy_cte(self) -> str:
        """``busy``: the rows of the statement's claims, not in ``mine``, still ours."""
        # The claims not in ``mine`` first: when none is busy, no row is read.
        return (
            "busy AS (SELECT t.id FROM (SELECT * FROM unnest(%(ids)s::uuid[], "
            "%(versions)s::bigint[]) AS u(id, version) WHERE u.id NOT IN (SELECT id FROM mine)) "
            # Each looked up by primary key (OFFSET 0: not flattened into a
            # join, which hundreds of ids made a hash join over the table).
            f"AS b CROSS JOIN LATERAL (SELECT id FROM {self.t} AS t WHERE t.id = b.id "
            f"AND t.version = b.version AND {self.d.holder('t')} = %(worker)s OFFSET 0) AS t)"
        )

    def renewal(self, slots: bool) -> str:
        """The heartbeat: the leases of the claims still ours renewed (``ids``,
        ``versions``, ``worker``, ``lease``), and with ``slots`` their limits' slots
        too; the ids still ours, and whether each is to be cancelled."""
        # Rows another session holds locked are left for a later heartbeat
        # (``busy``: still ours, so still held), instead of making every other
        # renewal of the statement wait for that session.
        claims = "unnest(%(ids)s::uuid[], %(versions)s::bigint[]) AS c(id, version)"
        renewed = (
            f"renewed AS (UPDATE {self.t} AS t "
            f"SET lease_expires_at = {self.d.now_plus_sql('%(lease)s')} FROM {claims} "
            f"WHERE t.id = c.id AND {IN_MINE} AND t.version = c.version "
            f"AND {self.d.holder('t')} = %(worker)s RETURNING t.id, t.cancel_requested)"
        )
        # The slots of the claims renewed, to the same time (db/limits.py).
        slots_renewed = (
            f"slots_renewed AS (UPDATE {self.limits.table} AS s "
            f"SET free_at = {self.d.now_plus_sql('%(lease)s')} FROM renewed AS r "
            f"JOIN {claims} ON c.id = r.id "
            "WHERE s.holder_id = c.id AND s.holder_version = c.version)"
        )
        answer = (
            "SELECT id, cancel_requested FROM renewed UNION ALL "
            f"SELECT t.id, t.cancel_requested FROM {self.t} AS t JOIN busy ON t.id = busy.id"
        )
        mine, busy = MINE.format(table=self.t, lock=LOCK), self.busy_cte()
        ctes = [mine, renewed, slots_renewed, busy] if slots else [mine, renewed, busy]
        return f"WITH {', '.join(ctes)} {answer}"

    def outcome_ctes(
        self, kinds: Sequence[OutcomeKind], moves: Mapping[str, str] | None
    ) -> tuple[list[str], list[str]]:
        """The CTEs that write the outcomes of ``kinds`` (``mine``, a ``d<i>`` each,
        ``busy``), and the names of the ``d<i>``: the rows each wrote."""
        t = self.t
        lock = MOVING_LOCK if moves is not None else LOCK
        ctes: list[str] = [MINE.format(table=t, lock=lock)] if kinds else []
        done: list[str] = []
        for i, kind in enumerate(kinds):
            assignments = self.d.outcome_assignments(kind, "t", OUTCOME_VALUES)
            guard = " AND NOT t.has_children" if kind in SETTLES_DEPENDANTS else ""
            rows = (
                f"(SELECT c.*, m.at FROM {outcome_rows(f'%(rows{i})s')} "
                "JOIN mine AS m ON m.id = c.id) AS c"
            )
            fence = (
                f"t.ctid = c.at AND {SAME_ID.format(source='c')} AND t.version = c.version "
                f"AND {self.d.holder('t')} = %(worker)s{guard}"
            )
            if moves is not None and kind.ends_task:
                # The row leaves the task table, written, for the finished
                # rows' (finished.py): fenced as the UPDATE is, so a stale
                # holder's outcome neither deletes nor inserts a row.
                ctes.append(
                    f"d{i} AS (DELETE FROM {t} AS t USING {rows} WHERE {fence} "
                    f"RETURNING {returning_written(moves, assignments)})"
                )
                ctes.append(f"h{i} AS ({insert_moved(f'd{i}', moves)})")
            else:
                sets = ", ".join(f"{column} = {value}" for column, value in assignments)
                ctes.append(
                    f"d{i} AS (UPDATE {t} AS t SET {sets} FROM {rows} WHERE {fence} "
                    "RETURNING t.id, t.queue_name)"
                )
            done.append(f"d{i}")
        if kinds:
            ctes.append(self.busy_cte())
        return ctes, done

    def statement(
        self,
        kinds: Sequence[OutcomeKind],
        frees: bool,
        claim: bool,
        mode: ClaimMode | None,
        form: ClaimForm,
        moves: Mapping[str, str] | None = None,
        bounded: bool = False,
        ahead: bool = False,
    ) -> str:
        """One round: write outcomes of ``kinds`` (freeing their slots if ``frees``),
        then claim in ``form`` if ``claim``. Rows come back marked: ``c``
        claimed, ``d`` written, ``b`` busy, ``p`` what the claim saw, ``m`` a
        key missing slots. With ``moves`` (the columns a moved row is copied by),
        the rows of the outcomes that end a task move to the table of finished
        rows (finished.py). ``bounded`` (the lean form only): the fresh rows and
        the expired leases are read from the lane's read frontier
        (db/frontier.py), and where the next read may start comes back, per
        queue and priority (``r``) and per queue (``l``)."""
        ctes, done = self.outcome_ctes(kinds, moves)
        if frees:
            # The limited claims these outcomes ended, once written: till
            # then the task is RUNNING, and its slot counts (db/limits.py).
            ctes.append(self.limited.ended(done))
        freeing = self.limited.freed(handed_over=claim and form != ClaimForm.LEAN)
        told = "SELECT 'f', NULL, (SELECT COALESCE(sum(n), 0) FROM told)::bigint"
        if not claim:
            if not done:
                return "SELECT 'p', NULL, 0 WHERE false"
            selects = [
                *(f"SELECT 'd', id::text, 0 FROM {d}" for d in done),
                "SELECT 'b', id::text, 0 FROM busy",
            ]
            if frees:
                ctes += freeing
                selects.append(told)
            return f"WITH {', '.join(ctes)} {' UNION ALL '.join(selects)}"
        mode = mode or ClaimMode.OPTIMISTIC
        bounded = bounded and form == ClaimForm.LEAN
        claim_ctes, seen, flags, details, missing = self.claim_ctes(
            mode, form, frees, bounded, ahead
        )
        ctes += claim_ctes
        if frees:
            # After ``go``: a slot it took back is not freed (one statement
            # never writes a row twice).
            ctes += freeing
        ctes.append(self.claimed_cte())
        parts = self.answer(kinds, done, seen, flags, details, frees)
        if bounded:
            parts += self.frontier_rows(ANSWER_WIDTH, derived=mode == ClaimMode.OPTIMISTIC)
        if missing:
            # Keys whose slots are missing (a new key, a raised limit): the
            # worker makes them after the round (db/limits.py, make_slots).
            rest = ", ".join(["NULL"] * (ANSWER_WIDTH - 3))
            parts.append(
                "SELECT 'm', NULL, NULL, NULL, jsonb_build_array(limit_key, n, period)::text, "
                f"{rest} FROM ({missing}) AS m"
            )
        head = "WITH RECURSIVE" if form == ClaimForm.WALK else "WITH"
        return f"{head} {', '.join(ctes)} {' UNION ALL '.join(parts)}"

    def handover(self, kinds: Sequence[OutcomeKind], moves: Mapping[str, str] | None = None) -> str:
        """The hand-over form: write outcomes of ``kinds``, and claim for each
        concurrency slot their limited claims held its key's next READY row, in
        that slot (limited.py, ``LimitedClaim.handover``). Nothing else is read:
        no expired lease, no row without a limit, no other key's.

        What a lane that ends a limited task runs, for at most
        ``HAND_OVER_WITHIN`` after its last claim in order (worker/lanes.py):
        a key's tasks follow each other in its slot for a statement of a few
        CTEs, not the window or walk form's every arm. A slot it does not hand
        over (its key has no due READY row, or another session holds it) is
        freed, and told if rows of its key wait, as every round's are."""
        ctes, done = self.outcome_ctes(kinds, moves)
        ctes.append(self.limited.ended(done))
        ctes += self.limited.handover()
        ctes.append(self.limited.taken())
        ctes += self.limited.freed(handed_over=True)
        ctes.append(self.claimed_cte())
        parts = self.answer(kinds, done, "SELECT count(*) FROM go", "''", "NULL::text", True)
        return f"WITH {', '.join(ctes)} {' UNION ALL '.join(parts)}"

    def claimed_cte(self) -> str:
        """``claimed``: the rows of ``go`` claimed, reached where they were locked."""
        returning = ", ".join(f"t.{c}" for c in CLAIM_COLUMNS)
        return (
            f"claimed AS (UPDATE {self.t} AS t SET "
            f"{self.d.claim_assignments('t', '%(claimer)s', '%(lease)s')} FROM go "
            # The picked rows where they were locked, however many (see IN_MINE).
            "WHERE t.ctid = ANY(ARRAY(SELECT at FROM go)) AND t.ctid = go.at "
            f"AND {SAME_ID.format(source='go')} AND t.version = go.version "
            f"RETURNING {returning}, go.status AS prev_status, "
            "go.worker_id AS prev_worker, go.last_attempted_at AS prev_attempted)"
        )

    @staticmethod
    def answer(
        kinds: Sequence[OutcomeKind],
        done: list[str],
        seen: str,
        flags: str,
        details: str,
        frees: bool,
    ) -> list[str]:
        """What a round that claims returns: the rows claimed (``c``), written
        (``d``) and busy (``b``); how many runnable rows the claim saw (more
        than it won: others won or hold the rest), what it found of limited
        rows (``flags``) and how long until a key that held rows back frees a
        slot (``details``), in one ``p`` row; and with ``frees``, how many
        slots it freed that READY rows wait for (``f``: each told, limited.py)."""
        blanks = ", ".join(["NULL"] * ANSWER_WIDTH)
        claimed = ", ".join(
            f"claimed.{c}::text" if c in SENT_AS_TEXT else f"claimed.{c}"
            for c in (*CLAIM_COLUMNS, "prev_status", "prev_worker", "prev_attempted")
        )
        rest = ", ".join(["NULL"] * (ANSWER_WIDTH - 3))
        parts = [
            f"SELECT 'c', {claimed} FROM claimed",
            *(f"SELECT 'd', id::text, {blanks} FROM {d}" for d in done),
            *([f"SELECT 'b', id::text, {blanks} FROM busy"] if kinds else []),
            f"SELECT 'p', NULL, ({seen})::bigint, {flags}, {details}, {rest}",
        ]
        if frees:
            told = "SELECT 'f', NULL, (SELECT COALESCE(sum(n), 0) FROM told)::bigint"
            parts.append(f"{told}, {', '.join(['NULL'] * (ANSWER_WIDTH - 1))}")
        return parts

    # -- the claim -----------------------------------------------------------------------

    def claim_ctes(
        self,
        mode: ClaimMode,
        form: ClaimForm,
        frees: bool,
        bounded: bool = False,
        ahead: bool = False,
    ) -> tuple[list[str], str, str, str, str]:
        """The CTEs ending in ``go`` (the rows to claim), and four SQL expressions:
        how many runnable rows were seen, the flags (``limited`` rows are
        there, a window asks for the ``walk``, full keys ``held`` rows back),
        the details (a jsonb's text: ``wait``, the seconds until a slot of those keys
        comes free by time; ``lost``, limited rows whose slot others took),
        and a query of the keys missing slots ('' in the lean form).
        ``frees``: the round ends limited claims, whose slots its claim may
        take back (limited.py).

        Every read is one per queue, a LATERAL over the queues' array: the
        statement (and its planning) is the same for one queue or ten.
        """
        t, now = self.t, self.now
        lean = form == ClaimForm.LEAN
        skip_locked = mode == ClaimMode.SKIP_LOCKED
        # Skip-locked reads lock as they read, a batch each; optimistic ones
        # read more than the batch (candidate_count), to lose some to others and
        # still fill it.
        part = "%(want)s" if skip_locked else "%(pool)s"
        lock = " FOR UPDATE SKIP LOCKED" if skip_locked else ""
        ctes = [
            # One index descent per queue, as a LATERAL with a LIMIT: a
            # semi-join could be planned as a hash of every limited READY row
            # (the prepared round's generic plan was).
            "lim AS MATERIALIZED (SELECT EXISTS (SELECT 1 FROM "
            f"{QUEUES} CROSS JOIN LATERAL (SELECT 1 FROM {t} WHERE status = '{READY}' "
            "AND queue_name = q.name AND limit_key IS NOT NULL LIMIT 1) AS x) AS limited)"
        ]
        # Lean: nothing is read when limited rows are there (the next form runs).
        # Ahead (a claim behind a running task, lean form only): the rows
        # without a limit, whatever limited rows are there.
        gate = " AND NOT (SELECT limited FROM lim)" if lean and not ahead else ""
        # Skip-locked: an expired lease of a row this round is finishing is ours.
        not_finishing = f" AND id NOT IN ({FINISHING})" if skip_locked else ""
        # An expired lease of a limited task takes a slot: the lean form does
        # not claim it (it holds, below), the others only where a slot is free.
        # Ahead: an expired lease without a limit only.
        if ahead:
            free = " AND limit_key IS NULL"
        else:
            free = "" if lean else f" AND {self.limits.available('t')}"
        expired = f"status = '{RUNNING}' AND queue_name = q.name AND lease_expires_at <= {now}"
        # Each read a range of its index in the index's order with a LIMIT:
        # its cost is the limit's, never a backlog's (another queue's expired
        # leases, a full key's READY rows).
        expired_rows = (
            f"SELECT {_ROW_COLS}, 0 AS reclaim, priority, run_after FROM {t} AS t "
            f"WHERE {expired}{not_finishing}{free}{gate}"
        )
        if bounded:
            ctes.append(self.frontier_cte())
            if not skip_locked:
                ctes.append(self.frontier_reads(part, gate))
            reads = [
                f"SELECT r.* FROM {QUEUES} CROSS JOIN LATERAL ({LEASES_FROM}) AS lf "
                f"CROSS JOIN LATERAL ({expired_rows} AND lease_expires_at >= lf.start "
                f"ORDER BY lease_expires_at LIMIT {part}{lock}) AS r",
                _per_queue(
                    self.fresh_rows_bounded(part, lock, gate)
                    if skip_locked
                    else self.fresh_rows_kept(part)
                ),
            ]
        else:
            reads = [
                _per_queue(f"{expired_rows} ORDER BY lease_expires_at LIMIT {part}{lock}"),
                _per_queue(self.fresh_rows(part, lock, gate)),
            ]
        reads.append(_per_queue(self.deferred_by_priority(part, lock, gate)))
        missing, walk, held, details = "", "false", "false", "NULL::text"
        if not lean:
            limited_ctes, limited_reads, missing, held, wait = self.limited.reads(
                part, lock, form == ClaimForm.WALK, frees
            )
            ctes += limited_ctes
            reads += limited_reads
            walk = "EXISTS (SELECT 1 FROM nb WHERE walk)"
            details = f"jsonb_build_object('wait', {wait}, 'lost', {self.limited.lost()})::text"
        rows = "ce" if skip_locked else "pool"
        # The lean form does not claim an expired lease of a limited task (it
        # takes a slot), the window form does not claim while a window is
        # filled: the next form claims, in order.
        if ahead:
            hold = "false"
        elif lean:
            hold = f"EXISTS (SELECT 1 FROM {rows} WHERE limit_key IS NOT NULL)"
        elif form == ClaimForm.WINDOW:
            hold = walk
        else:
            hold = "false"
        if skip_locked:
            # Lock while reading: each read skips what others hold, and the
            # rows read but not picked are let go when the statement ends.
            ctes += [f"c{i} AS ({sql})" for i, sql in enumerate(reads)]
            ctes.append("ce AS (SELECT * FROM c0)")
            union = " UNION ALL ".join(f"SELECT * FROM c{i}" for i in range(len(reads)))
            if not lean:
                # The limited rows take their slots before the batch is cut.
                ctes.append(f"offer AS MATERIALIZED ({union})")
                ctes += self.limited.slot_step(part, hold, frees)
                union = "SELECT * FROM ok"
            ctes.append(
                f"go AS (SELECT * FROM ({union}) u WHERE NOT ({hold}) "
                f"ORDER BY {CLAIM_ORDER} LIMIT %(want)s)"
            )
        else:
            # Optimistic: read without locks, then take the rows still unchanged
            # (the version compare-and-set), skipping any that someone holds locked.
            union = " UNION ALL ".join(f"({sql})" for sql in reads)
            if not lean:
                # The limited rows take their slots before the batch is cut.
                ctes.append(f"offer AS MATERIALIZED (SELECT * FROM ({union}) u)")
                ctes += self.limited.slot_step(part, hold, frees)
                union = "SELECT * FROM ok"
            ctes.append(
                f"pool AS MATERIALIZED (SELECT * FROM ({union}) u "
                f"ORDER BY {CLAIM_ORDER} LIMIT %(pool)s)"
            )
            # The pool's rows in claim order, each looked up and locked in
            # turn until the batch is full: more than the batch are read,
            # only about a batch's rows are looked up again (a join sorted
            # after it looked up and joined every row of the pool). Each where
            # the read found it (its ctid: one page, where the primary key's
            # descent is three or four); a row updated since then is no
            # longer there at that version, and is passed over as a lost race.
            slot = "" if lean else ", p.slot_id"
            ctes.append(
                "go AS (SELECT t.id, t.version, t.status, t.worker_id, "
                "t.last_attempted_at, t.limit_key, t.limit_count, t.limit_period, t.at, "
                f"p.reclaim, p.priority, p.run_after{slot} FROM (SELECT * FROM pool "
                f"WHERE id NOT IN ({FINISHING}) ORDER BY {CLAIM_ORDER}) AS p "
                f"CROSS JOIN LATERAL (SELECT {_ROW_COLS} FROM {t} "
                "WHERE ctid = p.at AND id = p.id AND version = p.version "
                f"AND {self.d.claimable('')} FOR UPDATE SKIP LOCKED) AS t "
                f"WHERE NOT ({hold}) LIMIT %(want)s)"
            )
        if not lean:
            ctes.append(self.limited.taken())
        limited = (
            f"(SELECT limited FROM lim) OR EXISTS (SELECT 1 FROM {rows} "
            "WHERE limit_key IS NOT NULL)"
        )
        if not lean:
            # What the lean form's expired reads would hold on (the first
            # expired leases, limited or not), so that it is not chosen again
            # for as long as one of them is limited, whether its key is full
            # or not.
            limited += (
                f" OR EXISTS (SELECT 1 FROM {QUEUES} CROSS JOIN LATERAL (SELECT limit_key "
                f"FROM {t} WHERE {expired} ORDER BY lease_expires_at LIMIT {part}) AS x "
                "WHERE x.limit_key IS NOT NULL)"
            )
        flags = (
            f"concat_ws(',', CASE WHEN {limited} THEN 'limited' END, "
            f"CASE WHEN {walk} THEN 'walk' END, CASE WHEN {held} THEN 'held' END)"
        )
        return ctes, f"SELECT count(*) FROM {rows}", flags, details, missing

    def fresh_rows(self, part: str, lock: str, gate: str) -> str:
        """The queue's (``q.name``) first ``part`` fresh READY rows, in claim order.

        Read straight in the index's order: a fresh row's ``run_after`` is
        the clock of the write that made it (``ready_arms``), so every one is
        due, and none lies in the way of another.
        """
        return (
            f"SELECT {_ROW_COLS}, 1 AS reclaim, priority, run_after FROM {self.t} "
            f"WHERE status = '{READY}' AND queue_name = q.name AND {FRESH} "
            f"AND run_after <= {self.now}{gate} "
            f"ORDER BY {ready_order()} LIMIT {part}{lock}"
        )

    # -- the read frontier (db/frontier.py) --------------------------------------------

    def fresh_ready(self, queue: str) -> str:
        """The condition of ``queue``'s fresh READY rows (the ``ready_fresh`` index's)."""
        return f"status = '{READY}' AND queue_name = {queue} AND {FRESH}"

    def frontier_cte(self) -> str:
        """``fq``: the (queue, priority) pairs whose fresh rows are read, each from
        where the lane's frontier says (``start``).

        The pairs come as arrays; with ``discover`` (a full read) each queue's
        priorities are found as well, one index descent each (the walk of
        ``deferred_by_priority``), and read from their start. Under a pinned
        snapshot those descents visit every dead entry at a priority's head,
        as a read from the head does: a full read costs what every read did
        before the frontier, and is made once in ``FULL_READ_SECONDS``.
        """
        t, ready = self.t, self.fresh_ready("q.name")
        walk = (
            f"WITH RECURSIVE pr(p) AS (SELECT max(priority) FROM {t} WHERE {ready} "
            f"UNION ALL SELECT (SELECT max(priority) FROM {t} WHERE {ready} "
            "AND priority < pr.p) FROM pr WHERE pr.p IS NOT NULL) SELECT p FROM pr "
            "WHERE p IS NOT NULL"
        )
        return (
            "fq AS MATERIALIZED (SELECT f.queue, f.priority, min(f.start) AS start FROM ("
            "SELECT * FROM unnest(%(fresh_queues)s::text[], %(fresh_priorities)s::int[], "
            "%(fresh_from)s::timestamptz[]) AS a(queue, priority, start) UNION ALL "
            f"SELECT q.name, w.p, '-infinity'::timestamptz FROM {QUEUES} "
            f"CROSS JOIN LATERAL ({walk}) AS w WHERE %(discover)s) AS f "
            "GROUP BY f.queue, f.priority)"
        )

    def fresh_rows_bounded(self, part: str, lock: str, gate: str) -> str:
        """``fresh_rows`` from the frontier: per (queue, priority) of ``fq``, a range
        of ``ready_fresh`` that starts at the pair's ``start`` (an index condition on
        all three columns), merged in claim order. Nothing before ``start`` is read:
        under a pinned snapshot, the dead entries of the rows claimed since the pin
        (which no scan may mark dead) are behind it."""
        return (
            f"SELECT b.* FROM fq CROSS JOIN LATERAL ({self.pair_read('q.name', part, lock, gate)}) "
            f"AS b WHERE fq.queue = q.name ORDER BY {ready_order('b')} LIMIT {part}"
        )

    def pair_read(self, queue: str, part: str, lock: str, gate: str) -> str:
        """The fresh rows of ``queue`` at an ``fq`` pair's priority, from its start."""
        return (
            f"SELECT {_ROW_COLS}, 1 AS reclaim, priority, run_after FROM {self.t} "
            f"WHERE {self.fresh_ready(queue)} AND priority = fq.priority "
            f"AND run_after >= fq.start AND run_after <= {self.now}{gate} "
            f"ORDER BY run_after LIMIT {part}{lock}"
        )

    def fresh_rows_kept(self, part: str) -> str:
        """``fresh_rows_bounded`` off ``fr``, the pairs' reads kept (optimistic mode)."""
        columns = ", ".join(f"fr.{c}" for c in FRONTIER_READ_COLUMNS)
        return (
            f"SELECT {columns} FROM fr WHERE fr.queue = q.name "
            f"ORDER BY {ready_order('fr')} LIMIT {part}"
        )

    def frontier_reads(self, part: str, gate: str) -> str:
        """``fr``: each pair's read (``pair_read``), kept (optimistic mode: read
        without locks), for the pairs' next starts to be derived from what was
        read (``frontier_rows``)."""
        return (
            "fr AS MATERIALIZED (SELECT fq.queue, b.* FROM fq CROSS JOIN LATERAL "
            f"({self.pair_read('fq.queue', part, '', gate)}) AS b)"
        )

    def frontier_rows(self, width: int, derived: bool = False) -> list[str]:
        """Where the next bounded read may start: ``r`` rows (queue, priority, start)
        and ``l`` rows (queue, start), in the columns of ``queue_name``,
        ``priority`` and ``run_after``.

        The start is the first row from the last start that this statement did
        not claim, read without a lock (so a row another session holds is not
        passed: it may stay READY), or the statement's clock when there is none.
        Every row before it was claimed here, or before: a row that commits
        later with an earlier key is a late commit, which its producer's
        notification brings back (db/frontier.py has the argument, and the
        expired leases' own).
        """
        t, now = self.t, self.now
        column = {name: i for i, name in enumerate(CLAIM_COLUMNS)}

        def row(marker: str, queue: str, priority: str, start: str) -> str:
            values = ["NULL"] * (width + 1)
            values[column["queue_name"]] = queue
            values[column["priority"]] = priority
            values[column["run_after"]] = start
            return f"SELECT '{marker}', {', '.join(values)}"

        not_claimed = "id NOT IN (SELECT id FROM claimed)"
        if derived:
            # Optimistic: from the pair's read itself (``fr``), unlocked, so
            # a row another session held is in it and not passed: its first
            # row not claimed here; if it claimed all it read, the last of
            # them when the read was cut by its LIMIT (more may follow), else
            # the clock. The read's rows again, not the index past them.
            pair = "fr.queue = fq.queue AND fr.priority = fq.priority"
            first_fresh = (
                f"(SELECT min(run_after) FROM fr WHERE {pair} AND fr.{not_claimed}), "
                f"(SELECT max(run_after) FROM fr WHERE {pair} "
                "HAVING count(*) >= %(pool)s)"
            )
        else:
            first_fresh = (
                f"(SELECT run_after FROM {t} WHERE {self.fresh_ready('fq.queue')} "
                f"AND priority = fq.priority AND run_after >= fq.start AND run_after <= {now} "
                f"AND {not_claimed} ORDER BY run_after LIMIT 1)"
            )
        first_expired = (
            f"(SELECT lease_expires_at FROM {t} WHERE status = '{RUNNING}' "
            f"AND queue_name = q.name AND lease_expires_at >= lf.start "
            f"AND lease_expires_at <= {now} AND {not_claimed} "
            "ORDER BY lease_expires_at LIMIT 1)"
        )
        return [
            row("r", "fq.queue", "fq.priority", f"COALESCE({first_fresh}, {now})") + " FROM fq",
            row("l", "q.name", "NULL", f"COALESCE({first_expired}, {now})")
            + " FROM unnest(%(queues)s::text[]) AS q(name) "
            + f"CROSS JOIN LATERAL ({LEASES_FROM}) AS lf",
        ]

    def deferred_by_priority(self, part: str, lock: str, gate: str) -> str:
        """The queue's (``q.name``) first ``part`` due deferred READY rows, in claim order.

        One read of the index in its order, ``priority DESC, run_after``, with
        ``run_after <= now`` as a filter, walks every row of a priority due
        later before it reaches the next one's due rows: with 100,000 tasks
        scheduled for later, 500 pages a round, however few are due. So the
        queue's priorities are walked instead (``pr``: one index descent
        each, a few in practice, 201 at most), and each priority's due rows
        are read as a range that ends at now.
        """
        t, now = self.t, self.now
        ready = f"status = '{READY}' AND queue_name = q.name AND {DEFERRED}"
        return (
            f"WITH RECURSIVE pr(p) AS (SELECT max(priority) FROM {t} WHERE {ready} "
            f"UNION ALL SELECT (SELECT max(priority) FROM {t} WHERE {ready} "
            "AND priority < pr.p) FROM pr WHERE pr.p IS NOT NULL) "
            f"SELECT d.* FROM pr CROSS JOIN LATERAL (SELECT {_ROW_COLS}, 1 AS reclaim, priority, "
            f"run_after FROM {t} WHERE {ready} AND priority = pr.p AND run_after <= {now}{gate} "
            f"ORDER BY run_after LIMIT {part}{lock}) AS d "
            f"ORDER BY {ready_order('d')} LIMIT {part}"
        )
