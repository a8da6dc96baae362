"""PostgreSQL's round: the claim of rows with a limit (the window and walk forms).

``RoundSQL`` (round.py) builds the round; this module adds, for the forms
that claim limited rows, the CTEs that read them and take their slots:

- **the reads** (``reads``): per queue a *window* of its first READY rows
  with a limit (``la``), each key's slots counted (``ka``), the window's rows
  offered as far as their key has free slots (``lr``); and in the walk form,
  for a queue whose window is filled by keys with no free slot (``nb``), its
  keys walked one index descent each (``kk``, ``kb``) and each key with free
  slots read for as many rows as it has (``rb``). No read's cost grows with a
  full key's backlog.
- **the slots, before the batch is cut** (``slot_step``): the first limited
  rows offered, in claim order (``lf``), take their key's free slots under
  the slots' row locks, skipping slots another session holds (``lk``,
  ``sf``); only the rows that got one go on (``ok``), each carrying its slot,
  beside the rows without a limit. The batch (``pool``, ``pick``) is then cut
  from those: a limited row that found no slot (its key full meanwhile, or
  its slot taken by another claimer) is passed over, and the rows behind it,
  limited or not, fill the batch in its place.
- **hand-over**: a concurrency slot held by a claim whose outcome this same
  statement writes (``ended``) is free for this statement's claim: the next
  task of a key is claimed by the round that ends the last, in the slot that
  round frees, without waiting for another round to see it free. A slot the
  claim does not take back is freed (``freed``) and, if READY rows of its
  key wait, a ``NOTIFY`` on ``SLOT_CHANNEL`` wakes one waiting claimer per
  worker process (``told``): workers held back by full keys wait for that,
  not for a poll.

What the statement says of the keys that held rows back (``held``): whether
there were any, and how long until the first of their slots comes free by
time (a rate window's end, a lapsing lease), by the database clock (``wait``).
"""

from __future__ import annotations

from collections.abc import Callable

from ...states import TaskStatus
from ..claim_order import CLAIM_ORDER, ready_order
from .channels import SLOT_CHANNEL

READY = TaskStatus.READY.value
#: Paused queues (``models.PausedQueue``, ``queues.py``): one row per queue an operator paused.
PAUSED_TABLE = "django_rdbtasks_pausedqueue"
#: The claim's queues, one row each, for the reads made per queue (LATERAL):
#: those of the request that are not paused. A paused queue is read by none of
#: the round's reads (expired leases, READY rows, limited rows, the probe), so
#: a pause costs its queue nothing but this one look-up by the table's unique
#: index, and is exact: a pause committed before the round began is seen by it.
QUEUES = (
    "(SELECT u.name FROM unnest(%(queues)s::text[]) AS u(name) WHERE NOT EXISTS "
    f"(SELECT 1 FROM {PAUSED_TABLE} AS p WHERE p.queue_name = u.name)) AS q(name)"
)


def missing_slots(keys: list[str]) -> str:
    """The keys of these slot counts that have fewer slots than their limit."""
    return (
        "SELECT DISTINCT limit_key, n, period FROM "
        f"({' UNION ALL '.join(keys)}) AS k WHERE have < n"
    )


class LimitedClaim:
    """The limited reads, the slot step and the slots' hand-over of one round."""

    def __init__(
        self,
        table: str,
        slot_table: str,
        now: str,
        free: Callable[[str], str],
        columns: str,
        finishing: str,
    ) -> None:
        #: The task table, the slot table, the database's clock, as SQL.
        self.t, self.s, self.now = table, slot_table, now
        #: A slot (its alias) free now, by its own columns (``LimitSQL.free``).
        self.free = free
        #: The ids of the claims the round is finishing, as a subquery (round.py).
        self.finishing = finishing
        #: What a claim reads of a row (round.py), with where the row is (``at``):
        #: off the table, and off a CTE of rows so read.
        self.columns = f"{columns}, ctid AS at"
        self.kept_columns = f"{columns}, at"
        self.lf_columns = ", ".join(f"lf.{c.strip()}" for c in self.kept_columns.split(","))

    # -- which slots are free ------------------------------------------------------------

    def slot_free(self, alias: str, handover: bool) -> str:
        """A slot this statement may take: free now, or held by a claim it ends (``ended``)."""
        free = self.free(alias)
        if not handover:
            return free
        return (
            f"({free} OR ({alias}.holder_id, {alias}.holder_version) IN "
            "(SELECT id, version FROM ended))"
        )

    def slot_counts(self, key: str, count: str, handover: bool) -> str:
        """A key's slots below ``count``: how many there are, how many this statement
        may take, and when the first of the others comes free by time (``next_at``)."""
        free = self.slot_free("s", handover)
        # (IS NOT TRUE: a slot without a holder compared with ``ended`` is NULL.)
        return (
            f"SELECT count(*) AS have, count(*) FILTER (WHERE {free}) AS free, "
            f"min(s.free_at) FILTER (WHERE ({free}) IS NOT TRUE) AS next_at "
            f'FROM {self.s} AS s WHERE s."key" = {key} AND s.slot_no < {count}'
        )

    # -- the reads -----------------------------------------------------------------------

    def reads(
        self, part: str, lock: str, walk: bool, handover: bool
    ) -> tuple[list[str], list[str], str, str, str]:
        """The CTEs and the reads of READY rows with a limit; the query of the keys
        missing slots; and two SQL expressions: whether keys with no slot free held
        rows back (``held``), and the seconds until the first of their slots comes
        free by time (``wait``, NULL if none will)."""
        t, now = self.t, self.now
        ready = f"status = '{READY}' AND queue_name = {{queue}} AND limit_key IS NOT NULL"
        head = "limit_key, limit_count, limit_period FROM " + t
        # The ``ready_key`` index's order: each key's rows in claim order.
        by_key = ready_order(after=["limit_key"])
        ctes = [
            # Each queue's window: its first rows with a limit, in claim order.
            "la AS MATERIALIZED (SELECT q.name AS queue, r.* FROM "
            f"{QUEUES} CROSS JOIN LATERAL (SELECT {self.columns}, priority, run_after FROM {t} "
            f"WHERE {ready.format(queue='q.name')} AND run_after <= {now} "
            f"ORDER BY {ready_order()} LIMIT {part}{lock}) AS r)",
            "ka AS MATERIALIZED (SELECT k.limit_key, k.n, k.period, k.rows, c.have, c.free, "
            "c.next_at FROM (SELECT limit_key, max(limit_count) AS n, "
            "max(limit_period) AS period, count(*) AS rows FROM la GROUP BY limit_key) AS k "
            f"CROSS JOIN LATERAL ({self.slot_counts('k.limit_key', 'k.n', handover)}) AS c)",
            # A key's rows in a window, as many as it has free slots.
            "lr AS (SELECT a.* FROM (SELECT la.*, row_number() OVER (PARTITION BY "
            f"la.queue, la.limit_key ORDER BY {ready_order('la')}) AS rn "
            "FROM la) AS a JOIN ka ON ka.limit_key = a.limit_key WHERE a.rn <= ka.free)",
            # A window was full, yet gave fewer rows than wanted: keys whose
            # slots are all taken fill it. Then its queue's keys are walked.
            "nb AS MATERIALIZED (SELECT q.name AS queue, "
            f"(SELECT count(*) FROM la WHERE la.queue = q.name) >= {part} AND "
            f"(SELECT count(*) FROM lr WHERE lr.queue = q.name) < {part} AS walk "
            f"FROM {QUEUES})",
        ]
        window = f"SELECT {self.kept_columns}, 1 AS reclaim, priority, run_after FROM lr"
        keys = ["SELECT limit_key, n, period, have FROM ka"]
        # Keys that held rows back: more rows in a window than free slots.
        held = ["SELECT next_at FROM ka WHERE free < rows"]
        if not walk:
            return ctes, [window], missing_slots(keys), *self._held(held)
        ctes += [
            # A loose index scan of each walked queue: each key's first row,
            # one index descent a key, however many rows it holds.
            f"kk AS ((SELECT nb.queue, f.* FROM nb CROSS JOIN LATERAL (SELECT {head} "
            f"WHERE {ready.format(queue='nb.queue')} "
            f"ORDER BY {by_key} LIMIT 1) AS f WHERE nb.walk) "
            f"UNION ALL SELECT k.queue, n.* FROM kk AS k CROSS JOIN LATERAL (SELECT {head} "
            f"WHERE {ready.format(queue='k.queue')} AND limit_key > k.limit_key "
            f"ORDER BY {by_key} LIMIT 1) AS n)",
            "kb AS MATERIALIZED (SELECT k.queue, k.limit_key, k.limit_count AS n, "
            "k.limit_period AS period, c.have, c.free, c.next_at FROM kk AS k CROSS JOIN LATERAL "
            f"({self.slot_counts('k.limit_key', 'k.limit_count', handover)}) AS c)",
            "rb AS (SELECT r.* FROM kb AS k CROSS JOIN LATERAL "
            f"(SELECT {self.columns}, priority, run_after FROM {t} "
            f"WHERE {ready.format(queue='k.queue')} AND limit_key = k.limit_key "
            f"AND run_after <= {now} ORDER BY {ready_order()} "
            f"LIMIT LEAST(k.free, {part}){lock}) AS r WHERE k.free > 0)",
        ]
        # Walked: a queue's key reads replace its window's rows (they hold them).
        reads = [
            f"{window} WHERE lr.queue IN (SELECT queue FROM nb WHERE NOT walk)",
            f"SELECT {self.kept_columns}, 1 AS reclaim, priority, run_after FROM rb",
        ]
        keys.append("SELECT limit_key, n, period, have FROM kb")
        held.append("SELECT next_at FROM kb WHERE free = 0")
        return ctes, reads, missing_slots(keys), *self._held(held)

    def _held(self, held: list[str]) -> tuple[str, str]:
        keys = " UNION ALL ".join(held)
        return (
            f"EXISTS ({keys})",
            f"(SELECT EXTRACT(EPOCH FROM min(next_at) - {self.now}) FROM ({keys}) AS h)",
        )

    # -- the slots -----------------------------------------------------------------------

    def slot_step(self, part: str, hold: str, handover: bool) -> list[str]:
        """``ok``: the rows of ``offer`` the batch is cut from, each limited one with
        a slot it locked (``slot_id``); and ``lost``, how many limited rows found none.

        Of the first ``part`` limited rows in claim order (``lf``), each key's
        rows take as many of its free slots as they are, locked, skipping any
        another session holds; PostgreSQL re-checks a locked row's
        ``free_at`` at its newest version, so a slot is never taken twice.
        The n-th row of a key gets the key's n-th slot locked; the rest stay
        READY, untouched.
        """
        s, key = self.s, '"key"'
        return [
            # Nothing is locked while the form holds (the next form claims),
            # nor for a claim the round finishes (its lapsed lease reads as
            # runnable, and the round never claims it again).
            "lf AS MATERIALIZED (SELECT o.*, row_number() OVER (PARTITION BY o.limit_key "
            f"ORDER BY {CLAIM_ORDER}) AS rn FROM (SELECT * FROM offer "
            f"WHERE limit_key IS NOT NULL AND id NOT IN ({self.finishing}) AND NOT ({hold}) "
            f"ORDER BY {CLAIM_ORDER} LIMIT {part}) AS o)",
            "lk AS (SELECT limit_key, max(limit_count) AS n, count(*) AS rows FROM lf "
            "GROUP BY limit_key)",
            f"sf AS MATERIALIZED (SELECT x.id, x.{key}, row_number() OVER (PARTITION BY "
            f"x.{key} ORDER BY x.slot_no) AS rn FROM lk CROSS JOIN LATERAL (SELECT s.id, "
            f"s.{key}, s.slot_no FROM {s} AS s WHERE s.{key} = lk.limit_key "
            f"AND s.slot_no < lk.n AND {self.slot_free('s', handover)} "
            "ORDER BY s.slot_no LIMIT lk.rows FOR UPDATE OF s SKIP LOCKED) AS x)",
            "ok AS (SELECT offer.*, NULL::bigint AS slot_id FROM offer "
            "WHERE limit_key IS NULL UNION ALL "
            f"SELECT {self.lf_columns}, lf.reclaim, lf.priority, lf.run_after, sf.id FROM lf "
            f"JOIN sf ON sf.{key} = lf.limit_key AND sf.rn = lf.rn)",
        ]

    @staticmethod
    def lost() -> str:
        """How many of the limited rows offered found no slot (others took them)."""
        return "(SELECT count(*) FROM lf) - (SELECT count(*) FROM sf)"

    def taken(self) -> str:
        """``taken``: the slots of the rows claimed, stamped with this start.

        A concurrency slot is held by the claim until its outcome (or its lease
        lapses); a rate slot is free a period after this start and the time
        the worker has to start the body (``%(start_within)s``: ``ClaimRequest``).
        """
        now = self.now
        return (
            f"taken AS (UPDATE {self.s} AS s SET "
            "holder_id = CASE WHEN go.limit_period > 0 THEN NULL ELSE go.id END, "
            "holder_version = CASE WHEN go.limit_period > 0 THEN NULL ELSE go.version + 1 END, "
            f"last_started_at = {now}, free_at = {now} + CASE WHEN go.limit_period > 0 "
            "THEN go.limit_period + %(start_within)s ELSE %(lease)s END * INTERVAL '1 second' "
            "FROM go WHERE s.id = go.slot_id)"
        )

    # -- the hand-over alone -------------------------------------------------------------

    def handover(self) -> list[str]:
        """``hs`` and ``go``: the slots of the claims ``ended`` ends, each given to
        its key's next READY row, read and locked in the key's own order.

        The hand-over form of the round (round.py, ``RoundSQL.handover``): no
        window, no walk, no other row read. Each slot is locked (skipped if
        another session holds it: it is then freed, not handed over) and
        still held by the claim ended here, so a stale holder's outcome,
        which ``ended`` never lists, hands nothing over. The row it takes
        must be due, READY, of a queue the claim serves and not paused, and
        allowed this slot by its own limit (a row enqueued under a lowered
        limit takes only the slots below it); a rate-limited row of the same
        key is not one (its slot is a rate slot).
        """
        t, s, now = self.t, self.s, self.now
        key = '"key"'
        return [
            f"hs AS MATERIALIZED (SELECT s.id AS slot_id, s.{key}, s.slot_no, e.queue_name "
            f"FROM ended AS e JOIN {s} AS s ON s.holder_id = e.id "
            "AND s.holder_version = e.version WHERE e.queue_name IN (SELECT name FROM "
            f"{QUEUES}) FOR UPDATE OF s SKIP LOCKED)",
            "go AS (SELECT r.*, hs.slot_id FROM hs CROSS JOIN LATERAL "
            f"(SELECT {self.columns}, 1 AS reclaim, priority, run_after FROM {t} "
            f"WHERE status = '{READY}' AND queue_name = hs.queue_name "
            f"AND limit_key = hs.{key} AND limit_count > hs.slot_no "
            f"AND COALESCE(limit_period, 0) <= 0 AND run_after <= {now} "
            f"ORDER BY {ready_order(after=['limit_key'])} LIMIT 1 FOR UPDATE SKIP LOCKED) AS r "
            f"ORDER BY {CLAIM_ORDER} LIMIT %(want)s)",
        ]

    # -- the slots the round's outcomes free ------------------------------------------

    @staticmethod
    def ended(done: list[str]) -> str:
        """``ended``: the limited claims this statement ends, whose outcome it wrote."""
        written = " UNION ALL ".join(f"SELECT id, queue_name FROM {d}" for d in done)
        return (
            "ended AS MATERIALIZED (SELECT f.id, f.version, w.queue_name FROM "
            "unnest(%(ended_ids)s::uuid[], %(ended_versions)s::bigint[]) AS f(id, version) "
            f"JOIN ({written}) AS w ON w.id = f.id)"
        )

    def freed(self, handed_over: bool) -> list[str]:
        """``freed``: the concurrency slots of ``ended`` not handed over to this
        round's claim (``go``), freed; ``told``: a NOTIFY per queue whose freed
        slots' keys have READY rows waiting, and how many such slots there are."""
        kept = " AND s.id NOT IN (SELECT slot_id FROM go WHERE slot_id IS NOT NULL)"
        # One index descent a freed slot, as a LATERAL with a LIMIT (a
        # semi-join could be planned as a read of every limited READY row).
        waiting = (
            f"SELECT 1 FROM {self.t} AS t WHERE t.status = '{READY}' "
            'AND t.queue_name = f.queue_name AND t.limit_key = f."key" LIMIT 1'
        )
        return [
            f"freed AS (UPDATE {self.s} AS s SET free_at = NULL, holder_id = NULL, "
            "holder_version = NULL FROM ended AS e WHERE s.holder_id = e.id "
            f"AND s.holder_version = e.version{kept if handed_over else ''} "
            'RETURNING s."key", e.queue_name)',
            f"told AS MATERIALIZED (SELECT w.n, pg_notify('{SLOT_CHANNEL}', w.queue_name) "
            "FROM (SELECT f.queue_name, count(*) AS n FROM freed AS f "
            f"CROSS JOIN LATERAL ({waiting}) AS x GROUP BY f.queue_name) AS w)",
        ]
