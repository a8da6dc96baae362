"""What a drain cost beyond its worker processes: the machine's CPU, WAL and commits.

The worker processes' own CPU (``getrusage`` of the reaped children, in
``measure``) leaves out the PostgreSQL backends that serve them, which do much
of a queue's work. So a drain also reads:

- the whole machine's busy CPU time from ``/proc/stat`` (every CPU, every
  process: the workers, the server, the harness's polls, and whatever else
  runs on the machine, which is why a busy machine inflates it);
- the PostgreSQL server's own CPU time, where its processes are visible here
  (a local server): its postmaster's, every process it runs (backends, WAL
  writer, checkpointer, autovacuum...) and every one it has reaped, from
  ``/proc/<pid>/stat``. Unlike the machine's, other work on the machine does
  not add to it (beyond what sharing the CPUs costs), though other databases'
  sessions on the same server do;
- the server's WAL position (``pg_current_wal_lsn()``): the bytes of WAL the
  drain wrote. WAL is the whole server's, so another database's writes meanwhile
  count too: ``other_transactions`` says whether there were any;
- ``pg_stat_database.xact_commit`` of the system's database: transactions
  committed, read-only ones included.

The server counters are read on a connection to another database (``postgres``),
so that reading them does not add to the system's count; that database is left
out of the others' count for the same reason.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psycopg

#: /proc/stat's "cpu" line: user nice system idle iowait irq softirq steal guest guest_nice.
#: Busy is all but idle and iowait; guest time is already inside user.
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
#: Readings of the server's processes before giving up on one that no session's end
#: interrupts (see ``server_busy_seconds``).
READ_ATTEMPTS = 20
#: How long to wait for the workers' server sessions to end (and flush their statistics).
SESSIONS_GONE_TIMEOUT = 10.0


def machine_busy_seconds() -> float | None:
    """CPU seconds all CPUs have spent busy since boot; None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = sum(int(fields[1 + i]) for i in BUSY_FIELDS if 1 + i < len(fields))
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    comm: str
    ppid: int
    #: utime, stime, cutime, cstime in clock ticks
    own_ticks: int
    children_ticks: int


def proc_stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            line = stat.read()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or parentheses.
    comm = line[line.index("(") + 1 : line.rindex(")")]
    fields = line[line.rindex(")") + 2 :].split()
    # fields[0] is the state (the stat's 3rd field): ppid is the 4th, utime to cstime
    # the 14th to 17th.
    return ProcStat(
        comm,
        int(fields[1]),
        int(fields[11]) + int(fields[12]),
        int(fields[13]) + int(fields[14]),
    )


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds process ``pid`` has used so far, to the nanosecond where the
    kernel keeps its scheduler statistics (``/proc/<pid>/schedstat``), else in
    clock ticks: a window of a few seconds of an idle server is a handful of
    10 ms ticks, too coarse for a ratio between two such windows."""
    try:
        with open(f"/proc/{pid}/schedstat") as schedstat:
            return int(schedstat.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    stat = proc_stat(pid)
    return None if stat is None else stat.own_ticks / os.sysconf("SC_CLK_TCK")


def session_busy_seconds(backend_pid: int) -> float | None:
    """CPU seconds one server session (its backend process) has used so far."""
    backend = proc_stat(backend_pid)
    if backend is None or backend.comm != "postgres":
        return None
    return backend.own_ticks / os.sysconf("SC_CLK_TCK")


def server_busy_seconds(backend_pid: int) -> float | None:
    """CPU seconds the PostgreSQL server serving ``backend_pid`` has used, all told.

    The postmaster (the backend's parent), what it has reaped (every ended
    session, with its whole life), and what it runs now: a difference of two
    readings is what the server used between them, sessions that came and went
    included. None where the backend is not a local ``postgres`` process (a
    server on another machine, or in another PID namespace).
    """
    backend = proc_stat(backend_pid)
    if backend is None or backend.comm != "postgres":
        return None
    for _ in range(READ_ATTEMPTS):
        postmaster = proc_stat(backend.ppid)
        if postmaster is None or postmaster.comm != "postgres":
            return None
        ticks = postmaster.own_ticks + postmaster.children_ticks
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                child = proc_stat(int(entry))
                if child is not None and child.ppid == backend.ppid:
                    ticks += child.own_ticks
        # A session reaped during the scan is in neither the children seen (if it was
        # gone when the scan reached it) nor the reaped total read before: read again.
        # (One that has ended but not been reaped is still listed, with its times.)
        again = proc_stat(backend.ppid)
        if again is not None and again.children_ticks == postmaster.children_ticks:
            return ticks / os.sysconf("SC_CLK_TCK")
    return None


@dataclass(frozen=True)
class ServerCounters:
    wal_lsn: str
    transactions: int  # xact_commit of the system's database
    #: xact_commit of every other database but the reader's own (``postgres``)
    other_transactions: int


def flush_own_statistics(conn: psycopg.Connection) -> None:
    """Make ``conn``'s session publish its pending statistics now, not within a second.

    A session publishes them as it goes idle, so the next reader sees them. One
    transaction of its own, in ``conn``'s database. It reads a catalog table
    because PostgreSQL skips the flush, transaction counts included, while the
    session has no table statistics pending. PostgreSQL 15 and later: an older
    server publishes within half a second anyway, so the count is off by a poll
    or two at most.
    """
    try:
        conn.execute("SELECT pg_stat_force_next_flush() FROM pg_catalog.pg_am LIMIT 1")
    except psycopg.errors.UndefinedFunction:
        pass


def read_server(stats: psycopg.Connection, database: str) -> ServerCounters:
    row = stats.execute(
        """
        SELECT pg_current_wal_lsn()::text,
               coalesce(sum(xact_commit) FILTER (WHERE datname = %(db)s), 0),
               coalesce(sum(xact_commit) FILTER (WHERE datname <> %(db)s), 0)
        FROM pg_stat_database
        WHERE datname IS DISTINCT FROM current_database()
        """,
        {"db": database},
    ).fetchone()
    assert row is not None
    return ServerCounters(str(row[0]), int(row[1]), int(row[2]))


def wal_bytes(stats: psycopg.Connection, before: str, after: str) -> int:
    row = stats.execute("SELECT pg_wal_lsn_diff(%s, %s)", (after, before)).fetchone()
    assert row is not None
    return int(row[0])


def wait_sessions_gone(stats: psycopg.Connection, database: str, keep: int) -> bool:
    """Wait until no session but ``keep`` (a backend pid) is connected to ``database``.

    A session flushes its statistics as it ends, after its client has gone:
    the workers' commits are in ``pg_stat_database`` only once their sessions are.
    """
    deadline = time.monotonic() + SESSIONS_GONE_TIMEOUT
    while True:
        row = stats.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> %s"
            " AND backend_type = 'client backend'",
            (database, keep),
        ).fetchone()
        if row is not None and row[0] == 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
