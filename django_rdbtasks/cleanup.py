"""What holds back the cleanup of the task tables: who, since when, and how much is waiting.

Every finished, retried or claimed task leaves a dead row version behind
(PostgreSQL) or an undo record (InnoDB). They go once no transaction could
still see them, so one transaction or snapshot left open holds back the
cleanup of everything written after it began, in every table: the task
table bloats, its indexes with it, and claims slow down, although the task
queue itself does nothing wrong. The usual holders:

- a session **idle in transaction** (an application that began a transaction
  and waits, a console left open);
- a long reader at REPEATABLE READ or SERIALIZABLE (a report, ``pg_dump``);
- a **prepared transaction** (two-phase commit) never finished;
- a **replication slot** whose consumer is gone (its ``xmin``);
- a **replica** with ``hot_standby_feedback`` on, whose own long queries
  hold the primary back (``pg_stat_replication.backend_xmin``).

``cleanup_report()`` finds them with their age, application and client, and
reads the task tables' dead rows and last (auto)vacuum; on MySQL/MariaDB, the
InnoDB history list length (undo not yet purged) and the oldest transactions.
``rdbtasks status`` (``--max-xmin-age``), the admin dashboard and the metrics
show it; docs/admin.md says what to do about each kind.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from django.apps import apps
from django.db import DatabaseError, connections

from .db.postgresql.cleanup import (
    PG_AUTOVACUUM,
    PG_PREPARED,
    PG_REPLICAS,
    PG_SEES_ALL,
    PG_SESSIONS,
    PG_SLOTS,
    PG_TABLES,
)
from .db.postgresql.finished import FINISHED_TABLE
from .jobs import database_now

#: A transaction open this long is shown as a holder; shorter ones are the
#: everyday traffic (the workers' own claims last milliseconds). The oldest
#: age is reported whatever it is.
SHOWN_AFTER = 5.0
#: Holders shown at most (the oldest).
SHOWN_AT_MOST = 10
#: Characters of a holder's current or last statement shown.
QUERY_CHARS = 300


class HolderKind:
    """What keeps old row versions: the ``kind`` of a ``Holder``."""

    SESSION = "session"
    PREPARED = "prepared transaction"
    SLOT = "replication slot"
    REPLICA = "replica"


@dataclass(frozen=True, slots=True)
class Holder:
    """One session, prepared transaction, slot or replica holding back the cleanup."""

    kind: str
    #: The process id, the prepared transaction's gid, the slot's name.
    name: str
    #: ``idle in transaction``, ``active``...; for a slot, ``active`` or ``inactive``.
    state: str = ""
    application: str = ""
    #: Address (and port) of the client; ``local`` for a Unix socket.
    client: str = ""
    user: str = ""
    #: Seconds its transaction (or snapshot) has been open, by the database's
    #: clock; None where the database does not know (slots, replicas).
    age: float | None = None
    #: PostgreSQL: transactions begun since the oldest one it can still see
    #: (``age(xmin)``), what vacuum's horizon is measured in.
    xid_age: int | None = None
    #: MySQL/MariaDB: its isolation level; PostgreSQL does not expose another session's.
    isolation: str = ""
    query: str = ""


@dataclass(frozen=True, slots=True)
class TableCleanup:
    """PostgreSQL's counts of one of the app's tables (``pg_stat_user_tables``)."""

    table: str
    live_rows: int
    dead_rows: int
    last_vacuum: dt.datetime | None
    last_autovacuum: dt.datetime | None
    last_analyze: dt.datetime | None
    last_autoanalyze: dt.datetime | None

    @property
    def last_vacuumed(self) -> dt.datetime | None:
        """The later of the last manual and the last automatic vacuum."""
        done = [t for t in (self.last_vacuum, self.last_autovacuum) if t is not None]
        return max(done) if done else None


@dataclass(slots=True)
class CleanupReport:
    vendor: str
    now: dt.datetime | None = None
    #: The holders older than ``SHOWN_AFTER`` (and every slot and replica), oldest first.
    holders: list[Holder] = field(default_factory=list)
    #: Seconds the oldest open transaction or snapshot has been open (None: none is).
    oldest_age: float | None = None
    #: PostgreSQL: the largest ``age(xmin)`` of any holder, slots and replicas included.
    oldest_xid_age: int | None = None
    #: Counted and shown apart: how many sessions have a transaction open at all.
    open_transactions: int = 0
    tables: list[TableCleanup] = field(default_factory=list)
    #: MySQL/MariaDB: InnoDB's history list length (undo records not yet purged).
    history_length: int | None = None
    #: What could not be read, and why (a privilege missing): the report is partial.
    problems: list[str] = field(default_factory=list)
    #: What else stops the cleanup (autovacuum turned off), one sentence each.
    notes: list[str] = field(default_factory=list)

    @property
    def supported(self) -> bool:
        return self.vendor in ("postgresql", "mysql")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``rdbtasks status --json``."""

        def iso(value: dt.datetime | None) -> str | None:
            return None if value is None else value.isoformat()

        return {
            "vendor": self.vendor,
            "oldest_age_seconds": None if self.oldest_age is None else round(self.oldest_age, 3),
            "oldest_xid_age": self.oldest_xid_age,
            "open_transactions": self.open_transactions,
            "history_length": self.history_length,
            "holders": [asdict(holder) for holder in self.holders],
            "tables": [
                {
                    "table": t.table,
                    "live_rows": t.live_rows,
                    "dead_rows": t.dead_rows,
                    "last_vacuum": iso(t.last_vacuum),
                    "last_autovacuum": iso(t.last_autovacuum),
                    "last_analyze": iso(t.last_analyze),
                    "last_autoanalyze": iso(t.last_autoanalyze),
                }
                for t in self.tables
            ],
            "problems": list(self.problems),
            "notes": list(self.notes),
        }


def task_tables() -> tuple[str, ...]:
    """The tables whose dead rows are shown whenever something holds the cleanup back."""
    from .models import Task

    return (Task._meta.db_table, FINISHED_TABLE)


def shown_tables(report: CleanupReport) -> list[TableCleanup]:
    """The tables the status and the dashboard show: where something holds the cleanup
    back, the task tables and any with dead rows. Alone, dead rows are a busy
    queue's everyday state, waiting for the next autovacuum."""
    if not report.holders:
        return []
    return [t for t in report.tables if t.dead_rows or t.table in task_tables()]


def app_tables() -> list[str]:
    """The tables of this app, the task table first (and PostgreSQL's table of finished rows)."""
    from .models import Task

    tables = [Task._meta.db_table, FINISHED_TABLE]
    for model in apps.get_app_config("django_rdbtasks").get_models():
        if not model._meta.proxy and model._meta.db_table not in tables:
            tables.append(model._meta.db_table)
    return tables


def cleanup_report(using: str) -> CleanupReport:
    """Who holds back the cleanup of ``using``'s tables, and what waits for it.

    Read on the database itself (the primary: its sessions are the ones
    vacuum waits for, a replica's feedback included). SQLite keeps no old
    row versions for others to hold: an empty report.
    """
    connection = connections[using]
    report = CleanupReport(vendor=connection.vendor)
    if not report.supported:
        return report
    report.now = database_now(using)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            _postgresql(cursor, report)
        else:
            _mysql(cursor, report)
    report.holders.sort(key=_oldest_first)
    del report.holders[SHOWN_AT_MOST:]
    return report


def _oldest_first(holder: Holder) -> tuple[float, float]:
    return (-(holder.xid_age or 0), -(holder.age or 0.0))


# -- PostgreSQL (its statements: db/postgresql/cleanup.py) ---------------------------------


def _postgresql(cursor: Any, report: CleanupReport) -> None:
    cursor.execute(PG_SEES_ALL)
    row = cursor.fetchone()
    if not (row and row[0]):
        report.problems.append(
            "This database user sees only its own sessions' transactions: "
            "GRANT pg_read_all_stats TO it to see every session's."
        )
    cursor.execute(PG_SESSIONS, [QUERY_CHARS])
    ages: list[float] = []
    for pid, state, application, host, port, user, age, xid_age, query in cursor.fetchall():
        report.open_transactions += 1
        age = None if age is None else max(0.0, float(age))
        if age is not None:
            ages.append(age)
        _older_xid(report, xid_age)
        if age is not None and age >= SHOWN_AFTER:
            report.holders.append(
                Holder(
                    HolderKind.SESSION,
                    str(pid),
                    state=state,
                    application=application,
                    client=host if port is None or port < 0 else f"{host}:{port}",
                    user=user,
                    age=age,
                    xid_age=xid_age,
                    query=query,
                )
            )
    cursor.execute(PG_PREPARED)
    for gid, owner, age, xid_age in cursor.fetchall():
        age = max(0.0, float(age))
        ages.append(age)
        _older_xid(report, xid_age)
        report.holders.append(
            Holder(HolderKind.PREPARED, gid, state="prepared", user=owner, age=age, xid_age=xid_age)
        )
    cursor.execute(PG_SLOTS)
    for name, slot_type, active, xid_age in cursor.fetchall():
        _older_xid(report, xid_age)
        report.holders.append(
            Holder(
                HolderKind.SLOT,
                name,
                state=f"{slot_type}, {'active' if active else 'inactive'}",
                xid_age=xid_age,
            )
        )
    cursor.execute(PG_REPLICAS)
    for pid, application, host, state, xid_age in cursor.fetchall():
        _older_xid(report, xid_age)
        report.holders.append(
            Holder(
                HolderKind.REPLICA,
                str(pid),
                state=state,
                application=application,
                client=host,
                xid_age=xid_age,
            )
        )
    report.oldest_age = max(ages, default=None)
    cursor.execute(PG_TABLES, [app_tables()])
    report.tables = [TableCleanup(*row) for row in cursor.fetchall()]
    cursor.execute(PG_AUTOVACUUM, [app_tables()])
    server_on, tables_off = cursor.fetchone()
    if not server_on:
        report.notes.append(
            "autovacuum is off on this server: dead rows stay until VACUUM is run "
            "(by hand or by a scheduled job)."
        )
    for table in tables_off or []:
        report.notes.append(f"autovacuum is off for {table} (autovacuum_enabled = false).")


def _older_xid(report: CleanupReport, xid_age: int | None) -> None:
    if xid_age is not None and (report.oldest_xid_age is None or xid_age > report.oldest_xid_age):
        report.oldest_xid_age = int(xid_age)


# -- MySQL and MariaDB ---------------------------------------------------------------------

#: InnoDB's open transactions, oldest first, with their connection's user,
#: host and command (``Sleep``: idle in its transaction; no statement is then
#: known). Each keeps the undo of every change made since its read view began,
#: in every table. Needs the PROCESS privilege. This connection is left out.
#: (No COALESCE: MariaDB cuts COALESCE(enum, '') to the literal's type's length.)
#: INNODB_TRX is a copy InnoDB refreshes only when nobody has read it for
#: 0.1 s: read more often than that, by anyone, it stays as it was.
MYSQL_TRANSACTIONS = """
    -- rdbtasks_cleanup_transactions
    SELECT t.trx_mysql_thread_id,
           t.trx_state,
           t.trx_isolation_level,
           TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1000000,
           p.USER,
           p.HOST,
           p.COMMAND,
           LEFT(t.trx_query, %s)
    FROM information_schema.INNODB_TRX AS t
    LEFT JOIN information_schema.PROCESSLIST AS p ON p.ID = t.trx_mysql_thread_id
    WHERE t.trx_mysql_thread_id <> CONNECTION_ID()
    ORDER BY t.trx_started
"""

#: The history list length: undo records of committed changes that purge has
#: not removed yet, because some read view may still need them.
MYSQL_HISTORY = """
    -- rdbtasks_cleanup_history
    SELECT * FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len'
"""

#: The program name each client gave (performance_schema, when it is on).
MYSQL_PROGRAMS = """
    -- rdbtasks_cleanup_programs
    SELECT PROCESSLIST_ID, ATTR_VALUE FROM performance_schema.session_connect_attrs
    WHERE ATTR_NAME = 'program_name'
"""

HISTORY_IN_STATUS = re.compile(r"History list length (\d+)")


def _mysql(cursor: Any, report: CleanupReport) -> None:
    report.history_length = _history_length(cursor, report)
    programs: dict[int, str] = {}
    try:
        cursor.execute(MYSQL_PROGRAMS)
        programs = {int(pid): str(name) for pid, name in cursor.fetchall()}
    except DatabaseError:
        pass  # performance_schema off: no program names, nothing else lost
    try:
        cursor.execute(MYSQL_TRANSACTIONS, [QUERY_CHARS])
        rows = cursor.fetchall()
    except DatabaseError as exc:
        report.problems.append(
            f"InnoDB's transactions could not be read ({exc}): the PROCESS privilege is needed."
        )
        return
    ages = []
    for thread, state, isolation, age, user, host, command, query in rows:
        report.open_transactions += 1
        age = max(0.0, float(age or 0))
        ages.append(age)
        if age < SHOWN_AFTER:
            continue
        report.holders.append(
            Holder(
                HolderKind.SESSION,
                str(thread),
                state="idle in transaction" if command == "Sleep" else str(state or "").lower(),
                application=programs.get(int(thread), ""),
                client=host or "",
                user=user or "",
                age=age,
                isolation=isolation or "",
                query=query or "",
            )
        )
    report.holders.sort(key=lambda holder: -(holder.age or 0.0))
    report.oldest_age = max(ages, default=None)


def _history_length(cursor: Any, report: CleanupReport) -> int | None:
    """From INNODB_METRICS where the counter is on, else from SHOW ENGINE INNODB STATUS."""
    try:
        cursor.execute(MYSQL_HISTORY)
        row = cursor.fetchone()
        if row is not None:
            names = [column[0].upper() for column in cursor.description]
            values = dict(zip(names, row, strict=True))
            # MySQL says STATUS 'enabled', MariaDB ENABLED 1.
            if values.get("STATUS") == "enabled" or values.get("ENABLED") in (1, "1"):
                return int(values["COUNT"])
        cursor.execute("SHOW ENGINE INNODB STATUS")
        found = HISTORY_IN_STATUS.search(str(cursor.fetchone()[-1]))
        return int(found.group(1)) if found else None
    except DatabaseError as exc:
        report.problems.append(
            f"InnoDB's history list length could not be read ({exc}): the PROCESS "
            "privilege is needed."
        )
        return None
