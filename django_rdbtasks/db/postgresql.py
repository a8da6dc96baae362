"""PostgreSQL: whole batches in one statement with ``unnest`` and ``RETURNING``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from .base import (
    CLAIM_COLUMNS,
    INSERT_COLUMNS,
    RUNNING,
    Candidate,
    ClaimedRow,
    Dialect,
    NewTask,
    Outcome,
)

NOTIFY_CHANNEL = "rdbtasks"


class PostgreSQLDialect(Dialect):
    vendor = "postgresql"
    now_sql = "STATEMENT_TIMESTAMP()"
    json_param = "%s::jsonb"

    def __init__(self, connection: Any) -> None:
        super().__init__(connection)
        t = self.table
        now = self.now_sql
        returning = ", ".join(f"t.{c}" for c in CLAIM_COLUMNS)
        claimable = (
            self.claimable_sql.replace("status", "t.status")
            .replace("run_after", "t.run_after")
            .replace("lease_expires_at", "t.lease_expires_at")
        )
        # Rows are locked in the order of the id array, which the caller sorts,
        # so two workers claiming overlapping batches cannot deadlock.
        self.claim_sql = (
            f"UPDATE {t} AS t SET status = '{RUNNING}', version = t.version + 1, "
            f"worker_id = %s, lease_expires_at = {self.now_plus_sql('%s')}, "
            f"attempts = t.attempts + 1, started_at = COALESCE(t.started_at, {now}), "
            f"last_attempted_at = {now} "
            "FROM unnest(%s::uuid[], %s::bigint[]) AS c(id, version) "
            f"WHERE t.id = c.id AND t.version = c.version AND {claimable} "
            f"RETURNING {returning}"
        )
        self.renew_sql = (
            f"UPDATE {t} AS t SET lease_expires_at = {self.now_plus_sql('%s')} "
            "FROM unnest(%s::uuid[], %s::bigint[]) AS c(id, version) "
            f"WHERE t.id = c.id AND t.version = c.version AND t.worker_id = %s "
            f"AND t.status = '{RUNNING}' RETURNING t.id, t.cancel_requested"
        )
        # has_children after the row lock: a dependant enqueued concurrently
        # set it before we could update, so we see it.
        batch_fence = (
            "WHERE t.id = c.id AND t.version = c.version AND t.worker_id = %s "
            f"AND t.status = '{RUNNING}' RETURNING t.id, t.has_children"
        )
        common = "version = t.version + 1, lease_expires_at = NULL"
        history = "history = t.history || jsonb_build_array(c.entry)"
        self.batch_outcome_sql = {
            "success": (
                f"UPDATE {t} AS t SET status = 'SUCCESSFUL', {common}, return_value = c.rv, "
                f"finished_at = {now}, {history} "
                "FROM unnest(%s::uuid[], %s::bigint[], %s::jsonb[], %s::jsonb[]) "
                f"AS c(id, version, rv, entry) {batch_fence}"
            ),
            "failure": (
                f"UPDATE {t} AS t SET status = 'FAILED', {common}, finished_at = {now}, "
                f"{history} FROM unnest(%s::uuid[], %s::bigint[], %s::jsonb[]) "
                f"AS c(id, version, entry) {batch_fence}"
            ),
            "retry": (
                f"UPDATE {t} AS t SET status = 'READY', {common}, worker_id = '', "
                f"run_after = {now} + c.delay * INTERVAL '1 second', {history} "
                "FROM unnest(%s::uuid[], %s::bigint[], %s::jsonb[], %s::float8[]) "
                f"AS c(id, version, entry, delay) {batch_fence}"
            ),
            "release": (
                f"UPDATE {t} AS t SET status = 'READY', {common}, worker_id = '', "
                "attempts = t.attempts - 1 "
                "FROM unnest(%s::uuid[], %s::bigint[]) "
                f"AS c(id, version) {batch_fence}"
            ),
        }

        # One statement for a whole batch of new rows: arrays in, rows out.
        self.insert_sql = (
            f"WITH n AS (SELECT {now} AS now), inserted AS ("
            f"INSERT INTO {t} ({', '.join(INSERT_COLUMNS)}) "
            "SELECT c.id, c.task_path, c.queue_name, c.backend_name, c.priority, c.args, "
            "c.kwargs, c.max_attempts, COALESCE(c.run_after, n.now), n.now, c.status, 0, '', "
            "0, '[]'::jsonb, c.job_name, c.dedup_key, c.waiting_on, c.on_parent_failure "
            "FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[], %s::int[], "
            "%s::jsonb[], %s::jsonb[], %s::int[], %s::timestamptz[], %s::text[], %s::text[], "
            "%s::text[], %s::int[], %s::text[]) "
            "AS c(id, task_path, queue_name, backend_name, priority, args, kwargs, "
            "max_attempts, run_after, job_name, dedup_key, status, waiting_on, "
            "on_parent_failure), n), "
            # NOTIFY in the same statement: an enqueue outside a transaction
            # is one round trip. PostgreSQL delivers it at commit.
            f"notified AS (SELECT pg_notify('{NOTIFY_CHANNEL}', q) FROM unnest(%s::text[]) q) "
            "SELECT n.now, (SELECT count(*) FROM notified) FROM n"
        )

    insert_is_one_statement = True

    def insert_tasks(
        self, cursor: Any, tasks: Sequence[NewTask], notify: bool = False
    ) -> dt.datetime:
        queues = sorted({t.queue_name for t in tasks}) if notify else []
        cursor.execute(
            self.insert_sql,
            [
                [t.id for t in tasks],
                [t.task_path for t in tasks],
                [t.queue_name for t in tasks],
                [t.backend_name for t in tasks],
                [t.priority for t in tasks],
                [t.args_json for t in tasks],
                [t.kwargs_json for t in tasks],
                [t.max_attempts for t in tasks],
                [t.run_after for t in tasks],
                [t.job_name for t in tasks],
                [t.dedup_key for t in tasks],
                [t.status for t in tasks],
                [t.waiting_on for t in tasks],
                [t.on_parent_failure for t in tasks],
                queues,
            ],
        )
        return cursor.fetchone()[0]

    def now_plus_sql(self, placeholder: str) -> str:
        return f"({self.now_sql} + {placeholder} * INTERVAL '1 second')"

    def json_append_sql(self, column: str, placeholder: str) -> str:
        return f"{column} || jsonb_build_array({placeholder}::jsonb)"

    def encode_id(self, value: Any) -> Any:
        return value

    def _claim(
        self, cursor: Any, candidates: Sequence[Candidate], worker_id: str, lease: float
    ) -> list[ClaimedRow]:
        ordered = sorted(candidates, key=lambda c: c.id)
        cursor.execute(
            self.claim_sql,
            [worker_id, lease, [c.id for c in ordered], [c.version for c in ordered]],
        )
        return [self.decode_claimed(row) for row in cursor.fetchall()]

    def renew(
        self, cursor: Any, held: Sequence[tuple[Any, int]], worker_id: str, lease: float
    ) -> tuple[set[Any], set[Any]]:
        ordered = sorted(held)
        cursor.execute(
            self.renew_sql, [lease, [i for i, _ in ordered], [v for _, v in ordered], worker_id]
        )
        rows = cursor.fetchall()
        return {row[0] for row in rows}, {row[0] for row in rows if row[1]}

    def finish(
        self, cursor: Any, outcomes: Sequence[Outcome], worker_id: str
    ) -> dict[Any, bool | None]:
        by_kind: dict[str, list[Outcome]] = {}
        for outcome in outcomes:
            by_kind.setdefault(outcome.kind, []).append(outcome)
        written: dict[Any, bool | None] = {}
        for kind, group in by_kind.items():
            sql = self.batch_outcome_sql.get(kind)
            if sql is None:
                written.update(super().finish(cursor, group, worker_id))
                continue
            group.sort(key=lambda o: o.id)
            columns: list[list[Any]] = [[o.id for o in group], [o.version for o in group]]
            if kind == "success":
                columns += [[o.return_json() for o in group], [o.entry_json() for o in group]]
            elif kind == "failure":
                columns.append([o.entry_json() for o in group])
            elif kind == "retry":
                columns += [[o.entry_json() for o in group], [o.delay for o in group]]
            cursor.execute(sql, [*columns, worker_id])
            written.update((row[0], row[1]) for row in cursor.fetchall())
        return written

    def notify(self, cursor: Any, queue_names: Iterable[str]) -> None:
        # Sent by PostgreSQL at commit, and not at all on rollback.
        for queue_name in sorted(set(queue_names)):
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, queue_name])
