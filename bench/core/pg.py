"""The local PostgreSQL server: throwaway databases and the harness's own queries."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql


@dataclass(frozen=True)
class PgServer:
    host: str = "127.0.0.1"
    port: int = 5432
    user: str = "postgres"
    password: str = ""

    def connect(self, dbname: str) -> psycopg.Connection:
        """An autocommit connection: the harness's reads must see other sessions' commits.

        Its queries run in its own backend alone, never in parallel workers:
        the measurements leave the harness's backend out of the server's CPU,
        and a poll's count over a big table, done in parallel, would put
        helper processes' CPU into it (a third of a drain's on a table of a
        million rows). Its VACUUM may still use parallel workers: they end
        before a phase begins, and without them the vacuum between turns
        left the next enqueue writing ten times the WAL (not looked into).
        """
        return psycopg.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password or None,
            dbname=dbname,
            autocommit=True,
            options="-c max_parallel_workers_per_gather=0",
        )

    def env(self, dbname: str) -> dict[str, str]:
        """What the systems' settings read (see the projects under bench/)."""
        return {
            "BENCH_DB_NAME": dbname,
            "BENCH_DB_HOST": self.host,
            "BENCH_DB_PORT": str(self.port),
            "BENCH_DB_USER": self.user,
            "BENCH_DB_PASSWORD": self.password,
        }

    def recreate_database(self, name: str) -> None:
        with self.connect("postgres") as conn:
            # FORCE ends sessions a crashed earlier run may have left behind.
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop_database(self, name: str) -> None:
        with self.connect("postgres") as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def started_at(self) -> str | None:
        """When the server last started: a change during a run means a restart spoiled it."""
        try:
            with self.connect("postgres") as conn:
                return str(conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0])
        except psycopg.Error:
            return None

    def describe(self) -> dict[str, str]:
        """The server's version and the settings that decide a commit's cost."""
        with self.connect("postgres") as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
            settings = {
                name: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0]
                for name in (
                    "fsync",
                    "synchronous_commit",
                    "wal_sync_method",
                    "shared_buffers",
                    "autovacuum",
                )
            }
        return {"server_version": version, **settings}


# The latency probe's side table: each probe task writes its key and start time.
CREATE_STARTED_TABLE = """
CREATE TABLE IF NOT EXISTS bench_started (
    key integer PRIMARY KEY,
    started_at double precision NOT NULL
)
"""


def table_name(table: str) -> sql.Identifier:
    """``table`` or ``schema.table`` (the Node peers keep theirs in a schema of their own)."""
    return sql.Identifier(*table.split("."))


def truncate(conn: psycopg.Connection, tables: list[str]) -> None:
    conn.execute(
        sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
            sql.SQL(", ").join(table_name(table) for table in tables)
        )
    )


def settle(conn: psycopg.Connection, tables: list[str], *, vacuum: bool = False) -> None:
    """Make the next timed phase start from the same state for every system.

    ANALYZE so that the planner has statistics for the rows just inserted
    (otherwise autovacuum's analyze lands at a random moment of the run), and
    CHECKPOINT so that the enqueue's WAL is not flushed during the timing.
    """
    command = "VACUUM ANALYZE" if vacuum else "ANALYZE"
    for table in tables:
        conn.execute(sql.SQL(command + " {}").format(table_name(table)))
    conn.execute("CHECKPOINT")


def scalar(conn: psycopg.Connection, query: str, params: tuple = ()) -> int:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])
