"""The task table's indexes, rebuilt once a held-back cleanup has grown them (PostgreSQL).

While a transaction or a snapshot is held open (a report at REPEATABLE READ,
``pg_dump``, a session idle in transaction, a replica's
``hot_standby_feedback``), vacuum can remove none of the versions the task
table's claims and moves leave behind, and its indexes grow with their
entries. Once the pin ends vacuum removes the entries, but the pages stay in
the files, and the indexes keep that size: after a ten-minute pin at 300
tasks a second they stayed at 12.6 MB where the heap came back to 3.4
(docs/benchmarks.md). The heap gives its empty pages back; the indexes only
as they are rebuilt.

``IndexRebuilder`` (a scheduler's, ``worker/scheduler.py``, every minute with
retention) notes a transaction open longer than ``QUIET_FOR``; once none is,
it rebuilds the task table's btree indexes that are many times
(``GROWN_FACTOR``) what its live rows need, with ``REINDEX INDEX
CONCURRENTLY`` (writes go on meanwhile: claims, enqueues and outcomes never
wait for it), one at a time, under a leased lock so that one scheduler of the
cluster does it. Not while the pin lasts: a rebuild waits for it, and would
grow again with the entries it must keep; not for the ordinary churn between
two vacuums either (see the class). Each lock it waits for is bounded
(``LOCK_WAIT``); a rebuild that fails part way leaves an invalid index,
dropped at once, or at the next step. Where the database user may not rebuild
the indexes (it does not own them) it says so once and stops trying. Oban's
``Reindexer`` plugin rebuilds its indexes so, once a day, whatever happened.
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError, connections

from .db.postgresql.index_bloat import (
    ENTRY_BYTES,
    PG_GROWN_INDEXES,
    PG_OLDEST_SNAPSHOT,
    PG_REBUILD_LEFTOVERS,
    drop_leftover_sql,
    rebuild_sql,
)
from .locks import LeasedLock
from .models import Task

logger = logging.getLogger("django_rdbtasks.index_rebuild")

#: An index is grown when larger than this many times what its live rows need...
GROWN_FACTOR = 4
#: ...plus this: a small table's indexes are never worth a rebuild.
SLACK_BYTES = 1024 * 1024
#: No rebuild while another transaction of the database has been open this long.
QUIET_FOR = 60.0
#: The longest a rebuild waits for one lock (it waits for the transactions
#: older than each of its steps): past it, it fails, and what it left is dropped.
LOCK_WAIT = "10s"


def grown_indexes(using: str, slack: int = SLACK_BYTES) -> list[tuple[str, int]]:
    """The task table's btree indexes grown past what its rows need: (name, bytes)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return []
    params: dict[str, str | int] = {
        "table": connection.ops.quote_name(Task._meta.db_table),
        "slack": slack,
        "factor": GROWN_FACTOR,
        "entry": ENTRY_BYTES,
    }
    with connection.cursor() as cursor:
        cursor.execute(PG_GROWN_INDEXES, params)
        return [(name, int(size)) for name, size in cursor.fetchall()]


def oldest_transaction_seconds(using: str) -> float:
    """How long the oldest transaction or snapshot of another session has been held."""
    with connections[using].cursor() as cursor:
        cursor.execute(PG_OLDEST_SNAPSHOT)
        return float(cursor.fetchone()[0])


class IndexRebuilder:
    """One scheduler's rebuilds of the task table's indexes on ``using``.

    ``step()``, every minute: while a transaction older than ``quiet_for``
    is open it only notes the pin; once none is, it rebuilds the indexes
    grown past what the table's live rows need, if it saw a pin since its
    last rebuild. Indexes are never rebuilt for the ordinary churn between
    two vacuums: a busy queue's indexes hold that many dead entries in
    steady state, and would grow back within a minute (and a rebuild's lock
    would cancel an autovacuum of the table)."""

    def __init__(
        self, using: str, *, slack: int = SLACK_BYTES, quiet_for: float = QUIET_FOR
    ) -> None:
        self.using = using
        self.slack = slack
        self.quiet_for = quiet_for
        #: A transaction held the cleanup back since the last rebuild.
        self.pin_seen = False
        #: The database user may not rebuild the indexes: not tried again.
        self.refused = False

    def step(self) -> list[str]:
        """The names of the indexes rebuilt (PostgreSQL; nothing elsewhere)."""
        connection = connections[self.using]
        if connection.vendor != "postgresql" or self.refused or connection.in_atomic_block:
            # (REINDEX CONCURRENTLY cannot run in a transaction.)
            return []
        oldest = oldest_transaction_seconds(self.using)
        if oldest > self.quiet_for:
            self.pin_seen = True
            return []
        if not self.pin_seen:
            return []
        drop_leftovers(self.using)
        grown = grown_indexes(self.using, self.slack)
        if not grown:
            self.pin_seen = False
            return []
        lock = LeasedLock("rdbtasks:rebuild-indexes", lease=60.0, using=self.using)
        if not lock.acquire():
            return []
        lock.start_renewing()  # a rebuild of a large index outlasts a lease
        try:
            rebuilt = [name for name, size in grown if self._rebuild(name, size)]
        finally:
            lock.stop_renewing()
            lock.release()
        if len(rebuilt) == len(grown):
            self.pin_seen = False
        return rebuilt

    def _rebuild(self, name: str, size: int) -> bool:
        connection = connections[self.using]
        table = connection.ops.quote_name(Task._meta.db_table)
        started = time.monotonic()
        try:
            rebuild_index(self.using, name)
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == "42501":
                self.refused = True
                logger.warning(
                    "the indexes of %s cannot be rebuilt by this database user (%s); "
                    "rebuild them as their owner: REINDEX TABLE CONCURRENTLY %s",
                    table,
                    exc,
                    table,
                )
            else:
                logger.warning("rebuilding %s failed, tried again later: %s", name, exc)
                drop_leftovers(self.using)
            return False
        logger.info(
            "rebuilt %s of %s (%.1f MB before, grown while a transaction held back the "
            "cleanup) in %.1f s",
            name,
            table,
            size / 2**20,
            time.monotonic() - started,
        )
        return True


def rebuild_index(using: str, name: str) -> None:
    """``REINDEX INDEX CONCURRENTLY`` of one index, each lock it waits for bounded by
    ``LOCK_WAIT``; a failure raises (``drop_leftovers`` then)."""
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, false)", [LOCK_WAIT])
        try:
            cursor.execute(rebuild_sql(connection.ops.quote_name(name)))
        finally:
            cursor.execute("RESET lock_timeout")


def drop_leftovers(using: str) -> list[str]:
    """Drop the invalid indexes failed rebuilds left on the task table; their names."""
    connection = connections[using]
    table = connection.ops.quote_name(Task._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(PG_REBUILD_LEFTOVERS, {"table": table})
        names = [name for (name,) in cursor.fetchall()]
        for name in names:
            try:
                cursor.execute(drop_leftover_sql(connection.ops.quote_name(name)))
            except DatabaseError as exc:
                logger.warning("dropping %s (a failed rebuild's) failed: %s", name, exc)
    return names
