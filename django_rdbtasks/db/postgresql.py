"""PostgreSQL: a whole round (finish a batch, claim the next) in one statement.

``jsonb_to_recordset`` turns the batch into rows, data-modifying CTEs write each
kind of outcome, and the claim locks its rows with ``FOR UPDATE SKIP LOCKED``,
so it never waits on a row another session holds.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from ..states import ClaimMode, OutcomeKind
from .base import (
    CANDIDATE_SPREAD,
    CLAIM_COLUMNS,
    INSERT_COLUMNS,
    READY,
    RUNNING,
    Candidate,
    ClaimedRow,
    ClaimRequest,
    Dialect,
    Exchange,
    NewTask,
    Outcome,
)
from .outcomes import SETTLES_DEPENDANTS
from .pg_sessions import PostgreSQLSessionBounds
from .preparing import preparing_cursor_class

NOTIFY_CHANNEL = "rdbtasks"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: The function one enqueue calls (created by migration 0005; a change to its
#: columns is a new version in a new migration, never an edit of this one).
ENQUEUE_FUNCTION = "rdbtasks_enqueue_v1"
ENQUEUE_SIGNATURE = (
    f"{ENQUEUE_FUNCTION}(uuid, text, text, text, integer, jsonb, jsonb, integer, "
    "timestamptz, text, text, text, integer, text, jsonb, boolean)"
)

#: The outcomes of one kind, as rows: one JSON document is far cheaper to send
#: than five arrays of quoted JSON texts.
_OUTCOME_ROWS = (
    "jsonb_to_recordset(%s::jsonb) AS c(id uuid, version bigint, rv jsonb, entry jsonb, "
    "delay float8)"
)
#: The rows of a statement's outcomes (or renewals) that no other session holds
#: locked, locked now: its writes touch only these, so none of them waits.
#: NO KEY UPDATE is the lock the UPDATE itself takes: it does not conflict with
#: the KEY SHARE a foreign key's check holds (a JobRecord written by once() in
#: a transaction still open), so such a row is not taken for busy.
_MINE = (
    "mine AS MATERIALIZED (SELECT id FROM {table} WHERE id = ANY(%s::uuid[]) "
    "FOR NO KEY UPDATE SKIP LOCKED)"
)
#: Where the previous holder's columns start in a row of the exchange's answer.
_PREVIOUS = 1 + len(CLAIM_COLUMNS)
_OUTCOME_VALUES = {"return_value": "c.rv", "entry": "c.entry", "delay": "c.delay"}


def _outcome_rows(outcomes: Sequence[Outcome]) -> str:
    # A JSON null becomes SQL NULL in jsonb_to_recordset: None stays "no value".
    return json.dumps(
        [
            {
                "id": str(o.id),
                "version": o.version,
                "rv": o.return_value,
                "entry": o.entry,
                "delay": o.delay,
            }
            for o in outcomes
        ],
        default=str,
    )


class PostgreSQLDialect(PostgreSQLSessionBounds, Dialect):
    vendor = "postgresql"
    now_sql = "STATEMENT_TIMESTAMP()"
    json_param = "%s::jsonb"
    exchange_is_one_statement = True
    row_lock_sql = "FOR NO KEY UPDATE SKIP LOCKED"  # see _MINE

    def __init__(self, connection: Any) -> None:
        super().__init__(connection)
        t = self.table
        now = self.now_sql
        # Rows another session holds locked are left for a later heartbeat
        # (``busy``: still ours, so still held), instead of making every other
        # renewal of the statement wait for that session.
        self.renew_sql = (
            f"WITH {_MINE.format(table=t)}, renewed AS (UPDATE {t} AS t "
            f"SET lease_expires_at = {self.now_plus_sql('%s')} "
            "FROM unnest(%s::uuid[], %s::bigint[]) AS c(id, version) "
            f"WHERE t.id = c.id AND t.id IN (SELECT id FROM mine) AND t.version = c.version "
            f"AND {self.holder('t')} = %s RETURNING t.id, t.cancel_requested), "
            # The slots of the claims renewed, to the same time (db/limits.py).
            f"slots_renewed AS (UPDATE {self.limits.table} AS s "
            f"SET free_at = {self.now_plus_sql('%s')} FROM renewed AS r "
            "JOIN unnest(%s::uuid[], %s::bigint[]) AS c(id, version) ON c.id = r.id "
            "WHERE s.holder_id = c.id AND s.holder_version = c.version), "
            f"{self._busy_cte()} "
            "SELECT id, cancel_requested FROM renewed UNION ALL "
            f"SELECT t.id, t.cancel_requested FROM {t} AS t JOIN busy ON t.id = busy.id"
        )
        # The same without the slots, for claims none of which is limited.
        start, end = self.renew_sql.index("slots_renewed AS"), self.renew_sql.index("busy AS")
        self.renew_unlimited_sql = self.renew_sql[:start] + self.renew_sql[end:]
        self._exchange_sql: dict[tuple, str] = {}

        # One statement for a whole batch of new rows: one JSON array of rows
        # in (see _batch_json), the clock out. One JSON text is encoded in C;
        # fifteen arrays cost the driver more than the insert costs the server.
        self.insert_sql = (
            f"WITH n AS (SELECT {now} AS now), inserted AS ("
            f"INSERT INTO {t} ({', '.join(INSERT_COLUMNS)}) "
            "SELECT (v->>0)::uuid, v->>1, v->>2, v->>3, (v->>4)::int, (v->>5)::jsonb, "
            "(v->>6)::jsonb, (v->>7)::int, COALESCE((v->>8)::timestamptz, n.now), n.now, "
            "v->>9, 0, '', 0, '[]'::jsonb, v->>10, v->>11, (v->>12)::int, v->>13, "
            "(v->>8)::timestamptz, (v->>14)::jsonb "
            "FROM jsonb_array_elements(%s::jsonb) AS r(v), n), "
            # NOTIFY in the same statement: an enqueue outside a transaction
            # is one round trip. PostgreSQL delivers it at commit.
            f"notified AS (SELECT pg_notify('{NOTIFY_CHANNEL}', q) FROM unnest(%s::text[]) q) "
            "SELECT n.now, (SELECT count(*) FROM notified) FROM n"
        )
        # One row, the common case (a request enqueues one task): a call of the
        # enqueue function (migration 0005), whose INSERT PL/pgSQL plans once
        # per session; where it is missing, the same row as a plain INSERT.
        columns = ", ".join(INSERT_COLUMNS)
        one_row = (
            f"INSERT INTO {t} ({columns}) VALUES (%s::uuid, %s, %s, %s, %s, %s::jsonb, "
            f"%s::jsonb, %s, COALESCE(%s::timestamptz, {now}), {now}, %s, 0, '', 0, "
            "'[]'::jsonb, %s, %s, %s, %s, %s::timestamptz, %s::jsonb) RETURNING enqueued_at"
        )
        self.insert_one_sql = {
            False: one_row,
            # Delivered by PostgreSQL at commit, still in the one round trip.
            True: f"{one_row}, pg_notify('{NOTIFY_CHANNEL}', queue_name)::text",
        }
        # Every parameter cast: bound on the server (new_cursor), a Python
        # int arrives as the smallest integer type that holds it.
        self.enqueue_call_sql = (
            f"SELECT {ENQUEUE_FUNCTION}(%s::uuid, %s::text, %s::text, %s::text, %s::integer, "
            "%s::jsonb, %s::jsonb, %s::integer, %s::timestamptz, %s::text, %s::text, "
            "%s::text, %s::integer, %s::text, %s::jsonb, %s::boolean)"
        )
        #: Whether the enqueue function exists, per database (settings NAME,
        #: HOST, PORT): looked up once per process, since a test run switches
        #: an alias to its test database, made with or without migrations.
        self._has_enqueue_function: dict[tuple, bool] = {}

    insert_is_one_statement = True

    def insert_tasks(
        self, cursor: Any, tasks: Sequence[NewTask], notify: bool = False
    ) -> dt.datetime:
        if len(tasks) == 1:
            t = tasks[0]
            params = [
                t.id,
                t.task_path,
                t.queue_name,
                t.backend_name,
                t.priority,
                t.args_json,
                t.kwargs_json,
                t.max_attempts,
                t.run_after,
                t.status,
                t.job_name,
                t.dedup_key,
                t.waiting_on,
                t.on_parent_failure,
            ]
            if self.enqueue_function_exists(cursor):
                cursor.execute(self.enqueue_call_sql, [*params, t.trace_context, notify])
                return _EPOCH + dt.timedelta(microseconds=cursor.fetchone()[0])
            cursor.execute(self.insert_one_sql[notify], [*params, t.run_after, t.trace_context])
            return cursor.fetchone()[0]
        queues = sorted({t.queue_name for t in tasks}) if notify else []
        cursor.execute(self.insert_sql, [self._batch_json(tasks), queues])
        return cursor.fetchone()[0]

    def new_cursor(self, connection: Any, *, prepare: bool = False) -> Any:
        # Parameters bound by the server: psycopg sends them beside the
        # statement rather than quoting each into its text, a quarter less
        # client CPU per enqueue. Prepared only by this cursor, and only
        # where the session is the server's own (see preparing.py).
        try:
            from django.db.backends.postgresql.base import ServerBindingCursor
            from django.db.backends.postgresql.psycopg_any import register_tzloader
        except ImportError:  # psycopg2
            return connection.create_cursor()
        cls = preparing_cursor_class() if prepare else ServerBindingCursor
        cursor = cls(connection.connection)
        # As on Django's own cursors: datetimes in the connection's time zone.
        register_tzloader(connection.timezone, cursor)
        return cursor

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

    def enqueue_function_exists(self, cursor: Any) -> bool:
        settings = self.connection.settings_dict
        key = (settings["NAME"], settings["HOST"], settings["PORT"])
        exists = self._has_enqueue_function.get(key)
        if exists is None:
            cursor.execute("SELECT to_regprocedure(%s) IS NOT NULL", [ENQUEUE_SIGNATURE])
            exists = self._has_enqueue_function[key] = bool(cursor.fetchone()[0])
        return exists

    @staticmethod
    def _batch_json(tasks: Sequence[NewTask]) -> str:
        """The rows for insert_sql, each a JSON array in the order it reads them."""
        return json.dumps(
            [
                [
                    str(t.id),
                    t.task_path,
                    t.queue_name,
                    t.backend_name,
                    t.priority,
                    t.args_json,
                    t.kwargs_json,
                    t.max_attempts,
                    None if t.run_after is None else t.run_after.isoformat(),
                    t.status,
                    t.job_name,
                    t.dedup_key,
                    t.waiting_on,
                    t.on_parent_failure,
                    t.trace_context,
                ]
                for t in tasks
            ]
        )

    def now_plus_sql(self, placeholder: str) -> str:
        return f"({self.now_sql} + {placeholder} * INTERVAL '1 second')"

    def json_append_sql(self, column: str, placeholder: str) -> str:
        return f"{column} || jsonb_build_array({placeholder}::jsonb)"

    def encode_id(self, value: Any) -> Any:
        return value

    # -- one round: finish and claim -----------------------------------------------------

    def exchange(
        self, cursor: Any, outcomes: Sequence[Outcome], worker_id: str, request: ClaimRequest | None
    ) -> Exchange:
        """One statement: write ``outcomes`` and claim ``request.want`` more.

        Outcomes that settle dependants are written here only for tasks known
        to have none (``has_children`` is read under the row lock); the others
        come back unwritten, for the caller to finish in a transaction that
        also releases or ends their dependants.
        """
        by_kind: dict[OutcomeKind, list[Outcome]] = {}
        for outcome in outcomes:
            by_kind.setdefault(outcome.kind, []).append(outcome)
        kinds = tuple(sorted(by_kind))
        claim = request is not None and request.want > 0
        mode = request.mode if request is not None else None
        queue_count = len(request.queues) if request is not None else 0
        ordered = sorted(outcomes, key=lambda o: o.id)
        # Only claims that may hold a slot need ``freed``: unlimited users'
        # rounds carry no slot step.
        ended = sorted(self.limits.ended(ordered))
        frees = bool(ended)
        key = (kinds, frees, claim, mode, queue_count)
        sql = self._exchange_sql.get(key)
        if sql is None:
            sql = self._exchange_sql[key] = self._build_exchange(
                kinds, frees, claim, mode, queue_count
            )
        ids = [o.id for o in ordered]
        params: list[Any] = [ids] if kinds else []
        for kind in kinds:
            group = sorted(by_kind[kind], key=lambda o: o.id)
            params += [_outcome_rows(group), worker_id]
        if kinds:
            params += [ids, [o.version for o in ordered], worker_id]
        if frees:
            params += [[i for i, _ in ended], [v for _, v in ended]]
        if claim:
            assert request is not None
            params += self._claim_params(request, [o.id for o in outcomes])
        cursor.execute(sql, params)
        result = Exchange()
        seen = 0
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
            else:
                seen = row[2]
        result.contended = claim and seen > len(result.claimed)
        return result

    def _busy_cte(self) -> str:
        """``busy``: the rows of the statement's claims, not in ``mine``, still ours."""
        # The claims not in ``mine`` first: when none is busy, no row is read.
        return (
            "busy AS (SELECT t.id FROM (SELECT * FROM unnest(%s::uuid[], %s::bigint[]) "
            "AS u(id, version) WHERE u.id NOT IN (SELECT id FROM mine)) AS b "
            f"JOIN {self.table} AS t ON t.id = b.id AND t.version = b.version "
            f"WHERE {self.holder('t')} = %s)"
        )

    def _claim_params(self, request: ClaimRequest, finishing: list[Any]) -> list[Any]:
        queues = list(request.queues)
        if request.mode == ClaimMode.SKIP_LOCKED:
            params: list[Any] = []
            for queue in queues:
                params += [queue, finishing, request.want]
            for queue in queues:
                params += [queue, request.want]
            params.append(request.want)
        else:
            pool = request.want * CANDIDATE_SPREAD
            per_queue = [value for queue in queues for value in (queue, pool)]
            params = [*per_queue, *per_queue, pool, finishing, request.want]
        # The finishing claims (``sf``), the slots' lease (``taken``), then the
        # claim's worker and lease.
        return [*params, finishing, request.lease, request.worker_id, request.lease]

    def _build_exchange(
        self,
        kinds: tuple[OutcomeKind, ...],
        frees: bool,
        claim: bool,
        mode: ClaimMode | None,
        queues: int,
    ) -> str:
        t = self.table
        ctes: list[str] = [_MINE.format(table=t)] if kinds else []
        done: list[str] = []
        for i, kind in enumerate(kinds):
            sets = ", ".join(
                f"{column} = {value}"
                for column, value in self.outcome_assignments(kind, "t", _OUTCOME_VALUES)
            )
            guard = " AND NOT t.has_children" if kind in SETTLES_DEPENDANTS else ""
            ctes.append(
                f"d{i} AS (UPDATE {t} AS t SET {sets} FROM {_OUTCOME_ROWS} "
                "WHERE t.id = c.id AND t.id IN (SELECT id FROM mine) AND t.version = c.version "
                f"AND {self.holder('t')} = %s{guard} RETURNING t.id)"
            )
            done.append(f"d{i}")
        if kinds:
            ctes.append(self._busy_cte())
        if frees:
            # The concurrency slots of the claims these outcomes ended, once
            # written: till then the task is RUNNING, and counts (db/limits.py).
            written = " UNION ALL ".join(f"SELECT id FROM {d}" for d in done)
            ctes.append(
                f"freed AS (UPDATE {self.limits.table} AS s SET free_at = NULL, "
                "holder_id = NULL, holder_version = NULL "
                "FROM unnest(%s::uuid[], %s::bigint[]) AS f(id, version) "
                f"WHERE f.id IN ({written}) "
                "AND s.holder_id = f.id AND s.holder_version = f.version)"
            )
        if not claim:
            if not done:
                return "SELECT 'p', NULL, 0 WHERE false"
            selects = " UNION ALL ".join(
                [*(f"SELECT 'd', id, 0 FROM {d}" for d in done), "SELECT 'b', id, 0 FROM busy"]
            )
            return f"WITH {', '.join(ctes)} {selects}"
        ctes += self._claim_ctes(mode or ClaimMode.OPTIMISTIC, queues)
        returning = ", ".join(f"t.{c}" for c in CLAIM_COLUMNS)
        ctes.append(
            f"claimed AS (UPDATE {t} AS t SET "
            f"{self.claim_assignments('t', '%s', '%s')} FROM go "
            "WHERE t.id = go.id AND t.version = go.version "
            f"RETURNING {returning}, go.status AS prev_status, "
            "go.worker_id AS prev_worker, go.last_attempted_at AS prev_attempted)"
        )
        blanks = ", ".join(["NULL"] * (len(CLAIM_COLUMNS) + 2))
        parts = [
            "SELECT 'c', claimed.* FROM claimed",
            *(f"SELECT 'd', id, {blanks} FROM {d}" for d in done),
            *([f"SELECT 'b', id, {blanks} FROM busy"] if kinds else []),
        ]
        # How many runnable rows the claim saw: more than it won means others
        # won or hold the rest (skip-locked: only the expired leases it saw).
        pool = "pool" if mode != ClaimMode.SKIP_LOCKED else "ce"
        parts.append(f"SELECT 'p', NULL, (SELECT count(*) FROM {pool}), {blanks[6:]}")
        return f"WITH {', '.join(ctes)} {' UNION ALL '.join(parts)}"

    def _claim_ctes(self, mode: ClaimMode, queues: int) -> list[str]:
        """``pick``: the rows to claim, locked; expired leases first, then READY in order."""
        t = self.table
        now = self.now_sql
        cols = (
            "id, version, status, worker_id, last_attempted_at, "
            "limit_key, limit_count, limit_period"
        )
        # Only rows whose key (if any) has a free slot now (db/limits.py).
        free = self.limits.available(t)
        # One read per queue and kind, each a range of its index in the
        # index's order with a LIMIT: its cost is the limit's, never a backlog's
        # (another queue's expired leases included).
        # Skip-locked: an expired lease of a row this round is finishing is ours.
        not_finishing = " AND id <> ALL(%s::uuid[])" if mode == ClaimMode.SKIP_LOCKED else ""
        expired = [
            f"SELECT {cols}, 0 AS reclaim, priority, run_after FROM {t} "
            f"WHERE status = '{RUNNING}' AND queue_name = %s AND lease_expires_at <= {now}"
            f"{not_finishing} AND {free} ORDER BY lease_expires_at LIMIT %s"
            for _ in range(queues)
        ]
        ready = [
            f"SELECT {cols}, 1 AS reclaim, priority, run_after FROM {t} "
            f"WHERE status = '{READY}' AND queue_name = %s AND run_after <= {now} "
            f"AND {free} ORDER BY priority DESC, run_after LIMIT %s"
            for _ in range(queues)
        ]
        if mode == ClaimMode.SKIP_LOCKED:
            # Lock while reading: each part skips what others hold, and the
            # rows read but not picked are let go when the statement ends.
            parts = [f"{sql} FOR UPDATE SKIP LOCKED" for sql in expired + ready]
            ctes = [f"c{i} AS ({sql})" for i, sql in enumerate(parts)]
            union = " UNION ALL ".join(f"SELECT * FROM c{i}" for i in range(len(parts)))
            expired_union = " UNION ALL ".join(f"SELECT * FROM c{i}" for i in range(queues))
            ctes.append(f"ce AS ({expired_union})")
            ctes.append(
                f"pick AS (SELECT * FROM ({union}) u "
                "ORDER BY reclaim, priority DESC, run_after LIMIT %s)"
            )
            return ctes + self._slot_ctes()
        # Optimistic: read without locks, then take the rows still unchanged
        # (the version compare-and-set), skipping any that someone holds locked.
        union = " UNION ALL ".join(
            f"(SELECT * FROM ({sql}) r{i})" for i, sql in enumerate(expired + ready)
        )
        return [
            f"pool AS MATERIALIZED (SELECT * FROM ({union}) u "
            "ORDER BY reclaim, priority DESC, run_after LIMIT %s)",
            f"pick AS (SELECT t.id, t.version, t.status, t.worker_id, t.last_attempted_at, "
            "t.limit_key, t.limit_count, t.limit_period, pool.reclaim, pool.priority, "
            f"pool.run_after FROM {t} AS t JOIN pool ON t.id = pool.id "
            f"AND t.version = pool.version WHERE {self.claimable('t')} "
            "AND t.id <> ALL(%s::uuid[]) "
            "ORDER BY pool.reclaim, pool.priority DESC, pool.run_after LIMIT %s "
            "FOR UPDATE OF t SKIP LOCKED)",
            *self._slot_ctes(),
        ]

    def _slot_ctes(self) -> list[str]:
        """``go``: the rows of ``pick`` to claim, each limited one with a free slot it took.

        The key's free slots are locked, skipping any another session holds;
        PostgreSQL re-checks a locked row's ``free_at`` at its newest version,
        so a slot is never taken twice. ``pick``'s rows of a key beyond its
        free slots are not claimed: they stay READY, untouched. A lapsed slot
        of a claim the same statement finishes is left to the next round.
        """
        s, key, now = self.limits.table, '"key"', self.now_sql
        return [
            "lk AS (SELECT limit_key, max(limit_count) AS n FROM pick "
            "WHERE limit_key IS NOT NULL GROUP BY limit_key)",
            f"sf AS MATERIALIZED (SELECT s.id, s.{key}, s.slot_no FROM {s} AS s "
            f"JOIN lk ON s.{key} = lk.limit_key AND s.slot_no < lk.n "
            f"WHERE {self.limits.free('s')} "
            # Not a slot of a claim this statement finishes, lapsed: ``freed``
            # writes that row, and one statement must not write a row twice.
            "AND (s.holder_id IS NULL OR s.holder_id <> ALL(%s::uuid[])) "
            "FOR UPDATE OF s SKIP LOCKED)",
            "go AS MATERIALIZED (SELECT p.*, sn.id AS slot_id FROM (SELECT pick.*, "
            "row_number() OVER (PARTITION BY limit_key "
            "ORDER BY reclaim, priority DESC, run_after) AS rn FROM pick) AS p "
            f"LEFT JOIN (SELECT id, {key}, row_number() OVER (PARTITION BY {key} "
            f"ORDER BY slot_no) AS rn FROM sf) AS sn ON sn.{key} = p.limit_key AND sn.rn = p.rn "
            "WHERE p.limit_key IS NULL OR sn.id IS NOT NULL)",
            # A concurrency slot is held by the claim until its outcome (or its
            # lease lapses); a rate slot is free a period after this start.
            f"taken AS (UPDATE {s} AS s SET "
            "holder_id = CASE WHEN go.limit_period > 0 THEN NULL ELSE go.id END, "
            "holder_version = CASE WHEN go.limit_period > 0 THEN NULL ELSE go.version + 1 END, "
            f"last_started_at = {now}, free_at = {now} + CASE WHEN go.limit_period > 0 "
            "THEN go.limit_period ELSE %s END * INTERVAL '1 second' "
            "FROM go WHERE s.id = go.slot_id)",
        ]

    def finish(
        self, cursor: Any, outcomes: Sequence[Outcome], worker_id: str
    ) -> dict[Any, bool | None]:
        """Every kind in one statement, telling which written tasks have dependants."""
        by_kind: dict[OutcomeKind, list[Outcome]] = {}
        for outcome in outcomes:
            by_kind.setdefault(outcome.kind, []).append(outcome)
        written: dict[Any, bool | None] = {}
        for kind, group in sorted(by_kind.items()):
            group.sort(key=lambda o: o.id)
            sets = ", ".join(
                f"{column} = {value}"
                for column, value in self.outcome_assignments(kind, "t", _OUTCOME_VALUES)
            )
            cursor.execute(
                f"UPDATE {self.table} AS t SET {sets} FROM {_OUTCOME_ROWS} "
                f"WHERE t.id = c.id AND t.version = c.version AND {self.holder('t')} = %s "
                "RETURNING t.id, t.has_children",
                [_outcome_rows(group), worker_id],
            )
            written.update((row[0], row[1]) for row in cursor.fetchall())
        self.limits.release(cursor, [o for o in outcomes if o.id in written])
        return written

    def claim_chosen(
        self, cursor: Any, chosen: Sequence[Candidate], worker_id: str, lease: float
    ) -> list[ClaimedRow]:
        cursor.execute(
            f"{self.claim_update_sql(len(chosen))} RETURNING {self._claim_cols}",
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
        renew: list[Any] = [ids, lease, ids, versions, worker_id]
        busy = [ids, versions, worker_id]
        if limited is not None and not any(i in limited for i in ids):
            cursor.execute(self.renew_unlimited_sql, [*renew, *busy])
        else:  # the slots (``slots_renewed``) too
            cursor.execute(self.renew_sql, [*renew, lease, ids, versions, *busy])
        rows = cursor.fetchall()
        return {row[0] for row in rows}, {row[0] for row in rows if row[1]}

    def notify(self, cursor: Any, queue_names: Iterable[str]) -> None:
        # Sent by PostgreSQL at commit, and not at all on rollback.
        for queue_name in sorted(set(queue_names)):
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, queue_name])
