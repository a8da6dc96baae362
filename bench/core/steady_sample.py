"""What bench/sustained.py reads while the load runs: the queue, the table, the CPU.

Two kinds of reading. A *probe* every few seconds counts the queue (READY rows
due, RUNNING rows: two counts over the partial status indexes, each a few
rows long while the workers keep up) and sees whether a vacuum of the table
is running. An *interval* row at the end of each
interval (a minute by default) adds what the tasks finished in it say (how
many, their start delays), the table's and each index's size, its live and
dead tuples and autovacuum's work (``pg_stat_user_tables``), the rows
inserted, updated (and how many of those were HOT) and deleted in the
interval, and the CPU the worker processes and the database's backends used.

The CPU comes from ``/proc``: it needs the harness on the server's host (a
local server, as the benchmark assumes); elsewhere it is left out (None).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from systems.rdbtasks import FINISHED_TABLE, TABLE, count_ready

#: The task table and, on PostgreSQL, the finished rows' (which inherits it):
#: sizes, tuples and writes are the sum of both.
TABLES = [TABLE, FINISHED_TABLE]
PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (field 3 first); None if gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces and parentheses itself.
    return text[text.rfind(")") + 2 :].split()


def session_cpu(session: int) -> float | None:
    """CPU seconds of every live process of a session, with what they reaped of their children.

    A worker process that exits is reaped by its supervisor, whose
    ``cutime``/``cstime`` then carry its CPU: the sum stays continuous.
    """
    if not PROC.is_dir():
        return None
    total = 0
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = proc_stat(int(entry.name))
        if fields is None or int(fields[3]) != session:  # field 6: the session id
            continue
        total += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    return total / TICKS


def process_cpu(pid: int) -> float | None:
    fields = proc_stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass
class Totals:
    """Cumulative counters, read at an interval's end; a row is the difference of two."""

    inserted: int
    updated: int
    hot_updated: int
    deleted: int
    worker_cpu: float | None
    #: The server's WAL position (all of it: a cluster of the benchmark's own).
    wal_lsn: str


@dataclass
class Sampler:
    conn: psycopg.Connection
    #: The session id of the workers' process tree (their supervisor's pid).
    workers_session: int | None
    #: (epoch seconds, READY rows due, RUNNING rows, a vacuum of the table running)
    #: of the probes not yet in a row.
    probes: list[tuple[float, int, int, bool]] = field(default_factory=list)
    previous: Totals | None = None
    #: CPU seconds of each database backend at the last reading, by pid.
    backend_cpu: dict[int, float] = field(default_factory=dict)
    #: The task table's own updates and deletes so far (the finished rows' table apart).
    hot_writes: int = 0
    #: The oldest snapshot's or xid's age (``oldest_xmin_age``) at the probes since the last row.
    xmin_ages: list[int] = field(default_factory=list)

    def start(self) -> None:
        """Take the counters the first interval is measured from."""
        self.previous = self._totals()
        self.hot_writes = relations(self.conn)[TABLE]["writes"]
        self._backends_cpu_delta()
        self.probe()

    def probe(self) -> None:
        at = time.time()
        row = self.conn.execute(
            f"SELECT {count_ready(' AND run_after <= now()')},"
            f" (SELECT count(*) FROM {TABLE} WHERE status = 'RUNNING'),"
            f" EXISTS (SELECT FROM pg_stat_progress_vacuum WHERE relid = '{TABLE}'::regclass)"
        ).fetchone()
        assert row is not None
        self.probes.append((at, int(row[0]), int(row[1]), bool(row[2])))
        age = oldest_xmin_age(self.conn)
        if age is not None:
            self.xmin_ages.append(age)

    def interval(self, since: float, until: float, enqueued: int | None) -> dict[str, Any]:
        """The row of the interval ``[since, until)`` (epoch seconds), read a little after it.

        Its queue depth is its probes' (the last one before ``until`` is the
        depth at its end); the counters are read now.
        """
        seconds = until - since
        inside = [probe for probe in self.probes if probe[0] < until] or self.probes[:1]
        self.probes = [probe for probe in self.probes if probe[0] >= until]
        finished, p50, p99, delay_max = self._finished(since, until)
        table = self._table()
        each = relations(self.conn)
        hot_writes = each[TABLE]["writes"] - self.hot_writes
        self.hot_writes = each[TABLE]["writes"]
        totals = self._totals()
        before = self.previous
        assert before is not None
        self.previous = totals
        worker_cpu = (
            None
            if totals.worker_cpu is None or before.worker_cpu is None
            else totals.worker_cpu - before.worker_cpu
        )
        server_cpu = self._backends_cpu_delta()
        updated = totals.updated - before.updated
        wal = self.conn.execute(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint",
            (totals.wal_lsn, before.wal_lsn),
        ).fetchone()
        assert wal is not None
        row = {
            "seconds": seconds,
            "enqueued_per_second": None if enqueued is None else enqueued / seconds,
            "finished_per_second": finished / seconds,
            "finished": finished,
            "depth_max": max(probe[1] for probe in inside),
            "depth_end": inside[-1][1],
            "running_max": max(probe[2] for probe in inside),
            "running_end": inside[-1][2],
            "probes": len(inside),
            # The share of the probes that found a vacuum of the table running: near
            # 1, vacuum runs back to back and the dead rows outrun it.
            "vacuuming_share": sum(probe[3] for probe in inside) / len(inside),
            "delay_p50_s": p50,
            "delay_p99_s": p99,
            "delay_max_s": delay_max,
            "pruned_per_second": (totals.deleted - before.deleted) / seconds,
            "inserted": totals.inserted - before.inserted,
            "updated": updated,
            "hot_share": (totals.hot_updated - before.hot_updated) / updated if updated else None,
            **table,
            "hot_table": each[TABLE],
            "finished_table": each[FINISHED_TABLE],
            # Every update or delete of a row of the table the claim reads leaves
            # a dead version there (and a non-HOT update an entry in each index).
            "hot_dead_versions_per_task": hot_writes / finished if finished else None,
            # The largest the probes saw: a pin released just before the row's
            # reading held the interval back all the same.
            "oldest_xmin_age": max(self.xmin_ages, default=None),
            "worker_cpu_s": worker_cpu,
            "server_cpu_s": server_cpu,
            "worker_cpu_us_per_task": _per_task(worker_cpu, finished),
            "server_cpu_us_per_task": _per_task(server_cpu, finished),
            "wal_bytes_per_task": int(wal[0]) / finished if finished else None,
            "load_average": os.getloadavg()[0],
        }
        self.xmin_ages.clear()
        # The probe nearest the interval's end stands for the start of the next.
        self.probes.insert(0, inside[-1])
        return row

    def _finished(
        self, since: float, until: float
    ) -> tuple[int, float | None, float | None, float | None]:
        """Tasks finished in the interval and their start delays (started_at - enqueued_at)."""
        row = self.conn.execute(
            "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY d),"
            " percentile_cont(0.99) WITHIN GROUP (ORDER BY d), max(d) FROM ("
            f"SELECT extract(epoch FROM started_at - enqueued_at)::float8 AS d FROM {TABLE}"
            " WHERE finished_at >= to_timestamp(%s) AND finished_at < to_timestamp(%s)) AS f",
            [since, until],
        ).fetchone()
        assert row is not None
        return int(row[0]), row[1], row[2], row[3]

    def _table(self) -> dict[str, Any]:
        row = self.conn.execute(
            "SELECT sum(pg_relation_size(relid))::bigint, sum(pg_indexes_size(relid))::bigint,"
            " sum(pg_total_relation_size(relid))::bigint, sum(n_live_tup)::bigint,"
            " sum(n_dead_tup)::bigint,"
            " sum(autovacuum_count)::bigint, sum(autoanalyze_count)::bigint,"
            " max(last_autovacuum), max(last_autoanalyze), sum(vacuum_count)::bigint,"
            " sum(analyze_count)::bigint"
            " FROM pg_stat_user_tables WHERE relname = ANY(%s) AND schemaname = current_schema()",
            [TABLES],
        ).fetchone()
        assert row is not None
        heap, indexes, total, live, dead, autovacuums, autoanalyzes = row[:7]
        last_autovacuum, last_autoanalyze, vacuums, analyzes = row[7:]
        index_sizes = dict(
            self.conn.execute(
                "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes"
                " WHERE relname = ANY(%s) AND schemaname = current_schema() ORDER BY indexrelname",
                [TABLES],
            ).fetchall()
        )
        mb = 2**20
        return {
            "heap_mb": heap / mb,
            "indexes_mb": indexes / mb,
            "toast_mb": (total - heap - indexes) / mb,
            "total_mb": total / mb,
            "index_mb": {name: size / mb for name, size in index_sizes.items()},
            "live_tuples": live,
            "dead_tuples": dead,
            "autovacuum_count": autovacuums,
            "autoanalyze_count": autoanalyzes,
            "vacuum_count": vacuums,
            "analyze_count": analyzes,
            "last_autovacuum": _stamp(last_autovacuum),
            "last_autoanalyze": _stamp(last_autoanalyze),
        }

    def _totals(self) -> Totals:
        row = self.conn.execute(
            # A row moved to the finished rows' table is deleted from the task
            # table and inserted there: counted once, as enqueued, not as pruned.
            "SELECT sum(n_tup_ins) FILTER (WHERE relname = %s), sum(n_tup_upd),"
            " sum(n_tup_hot_upd), sum(n_tup_del) - coalesce(sum(n_tup_ins)"
            " FILTER (WHERE relname = %s), 0)"
            " FROM pg_stat_user_tables WHERE relname = ANY(%s) AND schemaname = current_schema()",
            [TABLE, FINISHED_TABLE, TABLES],
        ).fetchone()
        assert row is not None
        worker_cpu = None if self.workers_session is None else session_cpu(self.workers_session)
        lsn = self.conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert lsn is not None
        return Totals(*(int(value) for value in row), worker_cpu=worker_cpu, wal_lsn=lsn[0])

    def _backends_cpu_delta(self) -> float | None:
        """CPU the database's backends (autovacuum's included) used since the last call.

        Per backend, since they come and go (an autovacuum worker, say): a new
        one counts from its start, one that ended loses its last few moments.
        """
        if not PROC.is_dir():
            return None
        pids = [
            pid
            for (pid,) in self.conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            ).fetchall()
        ]
        now: dict[int, float] = {}
        for pid in pids:
            cpu = process_cpu(pid)
            if cpu is not None:
                now[pid] = cpu
        delta = sum(cpu - self.backend_cpu.get(pid, 0.0) for pid, cpu in now.items())
        self.backend_cpu = now
        return delta


def relations(conn: psycopg.Connection) -> dict[str, dict[str, Any]]:
    """The task table and the finished rows' table apart: sizes, tuples, writes so far.

    ``pg_stat_user_tables`` counts each relation's own rows: the task table's
    figures are the hot table's alone, without the rows it inherits.
    """
    mb = 2**20
    return {
        name: {
            "heap_mb": heap / mb,
            "indexes_mb": indexes / mb,
            "live_tuples": live,
            "dead_tuples": dead,
            "updated": updated,
            "hot_updated": hot_updated,
            "deleted": deleted,
            "writes": updated + deleted,
        }
        for name, heap, indexes, live, dead, updated, hot_updated, deleted in conn.execute(
            "SELECT relname::text, pg_relation_size(relid), pg_indexes_size(relid), n_live_tup,"
            " n_dead_tup, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
            " WHERE relname = ANY(%s) AND schemaname = current_schema()",
            [TABLES],
        ).fetchall()
    }


def oldest_xmin_age(conn: psycopg.Connection) -> int | None:
    """How many transactions the oldest snapshot or xid on the server holds vacuum back."""
    row = conn.execute(
        "SELECT max(greatest(age(backend_xmin), age(backend_xid))) FROM pg_stat_activity"
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _per_task(cpu: float | None, tasks: int) -> float | None:
    return None if cpu is None or not tasks else cpu / tasks * 1e6


def _stamp(value: Any) -> str | None:
    return value.isoformat(timespec="seconds") if value is not None else None


def server_settings(conn: psycopg.Connection) -> dict[str, Any]:
    """The settings that decide how the table is vacuumed, and the table's own options."""
    names = [
        "server_version",
        "autovacuum",
        "autovacuum_naptime",
        "autovacuum_vacuum_scale_factor",
        "autovacuum_vacuum_threshold",
        "autovacuum_vacuum_insert_scale_factor",
        "autovacuum_analyze_scale_factor",
        "autovacuum_vacuum_cost_delay",
        "autovacuum_vacuum_cost_limit",
        "autovacuum_max_workers",
        "vacuum_cost_limit",
        "shared_buffers",
        "fsync",
        "synchronous_commit",
    ]
    settings = {
        name: value
        for name, value in conn.execute(
            "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name", [names]
        ).fetchall()
    }
    row = conn.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [TABLE]).fetchone()
    settings["table_reloptions"] = row[0] if row else None
    return settings
