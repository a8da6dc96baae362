"""How one database spells what every statement is made of.

Its clock and interval arithmetic, its JSON append, how it locks rows while
skipping those others hold, the tables' quoted names, and the pieces the
claim protocol's statements share (what is claimable, who holds a row, what
a claim and an outcome write). Below the dialects (``base.py`` and one module
per database) and below the statements that take these pieces (``limits.py``,
``ready_reads.py``, ``postgresql/round.py``), so that none of those needs the dialect.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.db import models

from ..states import OutcomeKind, TaskStatus
from . import clock
from .outcomes import OUTCOME_WRITES
from .rows import RowDecoding
from .tables import Tables

READY, RUNNING = TaskStatus.READY.value, TaskStatus.RUNNING.value
#: The task table's primary key as ``models.Task.id`` stores it, to encode ids
#: as the ORM would.
TASK_ID = models.UUIDField(primary_key=True)


class Spelling(RowDecoding):
    vendor = ""
    #: The database clock, in the form the DateTimeField columns store
    #: (``clock.py``); a pinned instant where a test pinned it.
    now_sql: str
    #: A JSON text parameter where a JSON column value is expected.
    json_param = "%s"
    #: Whether sessions lock rows (SQLite locks the whole database instead).
    has_row_locks = True
    #: How ``lock_rows`` takes the rows a worker is about to write, skipping
    #: any another session holds.
    row_lock_sql = "FOR UPDATE SKIP LOCKED"
    #: Whether a UNION's parts may each carry a locking clause, parenthesized
    #: (MySQL 8, MariaDB); PostgreSQL refuses any in a UNION.
    locks_in_union = False
    #: An INSERT of ``{values}`` that skips rows whose unique key exists.
    insert_ignore_sql = "INSERT INTO {table} ({columns}) VALUES {values} ON CONFLICT DO NOTHING"
    #: Before the task table's name in the worker's reads and writes (postgresql/finished.py).
    only_sql = ""
    #: Whether turning autocommit off and on around a transaction costs a round
    #: trip each (MySQL): the worker's sessions then leave it off between their
    #: transactions (``worker/lazy_autocommit.py``).
    autocommit_is_a_statement = False

    def __init__(
        self, connection: Any, tables: Tables, *, pinned_now: dt.datetime | None = None
    ) -> None:
        # A test pinned this alias's clock (testing.clock): every statement
        # built with these pieces reads that instant instead of the server's clock.
        self.now_sql = clock.now_sql(self.vendor, pinned_now)
        #: Whether ``now_sql`` is a pinned instant rather than the server's clock.
        self.clock_pinned = pinned_now is not None
        #: The connection the dialect was made with (another thread's, maybe:
        #: see ``connection``).
        self.first_connection = connection
        self.tables = tables
        qn = connection.ops.quote_name
        self.table = self.only_sql + qn(tables.task)  # its reads, updates, deletes
        self.insert_table = qn(tables.task)  # an INSERT's, a COPY's
        self.paused_table = qn(tables.paused_queue)
        self.limit_slot_table = qn(tables.limit_slot)

    # -- pieces each database spells its own way -------------------------------------

    def now_plus_sql(self, placeholder: str, now: str | None = None) -> str:
        """SQL for the database's time plus ``placeholder`` seconds (as
        ``seconds_param`` gives them); ``now``: that time as an SQL expression of
        its own (a parameter), not the clock's (``now_sql``)."""
        raise NotImplementedError

    def seconds_param(self, seconds: float) -> Any:
        return seconds

    def json_append_sql(self, column: str, placeholder: str) -> str:
        """SQL for ``column`` with the JSON object in ``placeholder`` appended."""
        raise NotImplementedError

    @property
    def connection(self) -> Any:
        """This thread's connection under the dialect's alias.

        A dialect is made once per alias and shared by every thread, with the
        connection object of the thread that first asked for it; a Django
        connection may be used only by the thread that made it, and MySQL's
        asks the server what it is (``mysql_is_mariadb``) the first time, from
        places as innocent-looking as a UUID's conversion. So every use goes
        through the calling thread's own.
        """
        from django.db import connections
        from django.utils.connection import ConnectionDoesNotExist

        first = self.first_connection
        try:
            return connections[first.alias]
        except ConnectionDoesNotExist:  # a private alias this thread has not opened
            return first

    def current_time(self, cursor: Any) -> Any:
        """The database clock, as the driver returns it for a DateTimeField column."""
        cursor.execute(f"SELECT {self.now_sql}", [])
        return cursor.fetchone()[0]

    def encode_id(self, value: uuid.UUID) -> Any:
        return TASK_ID.get_db_prep_value(value, self.connection)

    # -- SQL building blocks -----------------------------------------------------------

    # Where a statement addresses rows by id, its conditions on the status are
    # CASE expressions, which no index can serve and no partial index's
    # predicate follows from: the planner's only cheap way to the rows is then
    # the primary key, whatever its statistics say. Spelled plainly, they let
    # it prefer a scan of every READY or RUNNING row whenever the last ANALYZE
    # saw few of them, which is exactly when a backlog builds unseen.

    def claimable(self, alias: str) -> str:
        """Runnable now: READY and due, or RUNNING with its lease run out."""
        p = f"{alias}." if alias else ""
        now = self.now_sql
        return (
            f"(CASE {p}status WHEN '{READY}' THEN {p}run_after <= {now} "
            f"WHEN '{RUNNING}' THEN {p}lease_expires_at <= {now} ELSE FALSE END)"
        )

    @staticmethod
    def holder(alias: str) -> str:
        """The worker that holds the row, NULL unless it is RUNNING: a fence's test."""
        p = f"{alias}." if alias else ""
        return f"(CASE WHEN {p}status = '{RUNNING}' THEN {p}worker_id END)"

    def claim_assignments(
        self,
        alias: str,
        worker_id: str,
        lease: str,
        *,
        qualified: bool = False,
        now: str | None = None,
    ) -> str:
        """The SET list of a claim; ``worker_id`` and ``lease`` are SQL expressions.

        ``qualified``: the columns set named by ``alias`` too, as an UPDATE of
        two tables needs (MySQL); PostgreSQL refuses a qualified target.
        ``now``: the claim's time as an SQL expression (``Claimable.read_at``'s
        parameter), not the clock's at the write."""
        p = f"{alias}." if alias else ""
        s = p if qualified else ""
        lease_end = self.now_plus_sql(lease, now)
        now = now or self.now_sql
        return (
            f"{s}status = '{RUNNING}', {s}version = {p}version + 1, {s}worker_id = {worker_id}, "
            f"{s}lease_expires_at = {lease_end}, {s}attempts = {p}attempts + 1, "
            f"{s}started_at = COALESCE({p}started_at, {now}), {s}last_attempted_at = {now}"
        )

    def outcome_assignments(
        self, kind: OutcomeKind, alias: str, values: dict[str, str]
    ) -> list[tuple[str, str]]:
        """``(column, SQL)`` pairs of what ``kind`` writes, in template order.

        ``values`` gives the SQL for ``return_value``, ``entry`` and ``delay``
        (a placeholder, or a column of an ``unnest``), used in this order.
        """
        p = f"{alias}." if alias else ""
        pieces = {
            "now": self.now_sql,
            "delayed": self.now_plus_sql(values.get("delay", "%s")),
            "history": self.json_append_sql(f"{p}history", values.get("entry", "%s")),
            "return_value": values.get("return_value", "%s"),
            "attempt_back": f"{p}attempts - 1",
        }
        assignments: list[tuple[str, str]] = []
        if kind.status is not None:
            assignments.append(("status", f"'{kind.status.value}'"))
            assignments += [
                ("version", f"{p}version + 1"),
                ("lease_expires_at", "NULL"),
            ]
        for column, template in OUTCOME_WRITES[kind].items():
            assignments.append((column, template.format(**pieces)))
        return assignments

    @staticmethod
    def outcome_param_names(kind: OutcomeKind) -> list[str]:
        """The outcome values a rendered row statement takes, in placeholder order."""
        names = []
        for template in OUTCOME_WRITES[kind].values():
            if "{delayed}" in template:
                names.append("delay")
            elif "{history}" in template:
                names.append("entry")
            elif "{return_value}" in template:
                names.append("return_value")
        return names
