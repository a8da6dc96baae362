"""MySQL and MariaDB: no RETURNING on UPDATE, so a claim is read back by its mark.

A round (finish, then claim) is one transaction of a few statements. The rows
to claim are locked first with ``FOR UPDATE SKIP LOCKED`` (MySQL 8, MariaDB
10.6), so the claim's UPDATE touches only rows this transaction holds and
reading them back by id is exact.

On a MariaDB Galera cluster those row locks are local to the node that took
them: the claim's version compare-and-set is what keeps two workers on two
nodes from both winning a row (Galera certifies the conflicting commits and
fails all but the first with error 1213, which the worker retries as a lost
race). So only the optimistic mode runs there; see ``docs/galera.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from django.db import OperationalError

from ..database_errors import MYSQL_PACKET_TOO_LARGE, mysql_errno
from ..states import ClaimMode
from .base import CLAIM_COLUMNS, INSERT_COLUMNS, Candidate, ClaimedRow, Dialect
from .inserts import TaskInserts
from .rows import Claimable, ClaimRequest

#: Where the values that differ per row of a batch go (``insert_values``'s
#: order): its id and arguments, in this order.
_VARYING = frozenset(INSERT_COLUMNS.index(column) for column in ("id", "args", "kwargs"))
#: How long (estimated, before escaping) one multi-row INSERT of a batch may
#: be: far below any server's ``max_allowed_packet`` (4 MB at the least).
_STATEMENT_BYTES = 256 * 1024


class MySQLInserts(TaskInserts):
    """The portable enqueue, with a bulk enqueue's shared values written once."""

    def insert_batch_rows(self, cursor: Any, first: tuple, varying: list[tuple]) -> None:
        """Multi-row INSERTs whose shared values are written once, as literals.

        mysqlclient's ``executemany`` escapes every parameter of every row in
        Python: three quarters of a bulk enqueue's client time went into the
        18 values each row shares. Here they are escaped once (the driver's
        ``mogrify``) and only the id and the arguments are parameters.
        """
        mogrify = getattr(cursor, "mogrify", None)  # mysqlclient 2.2+
        if mogrify is None:
            super().insert_batch_rows(cursor, first, varying)
            return
        values = ", ".join(
            "%s" if index in _VARYING else mogrify("%s", [value]).replace("%", "%%")
            for index, value in enumerate(first)
        )
        row = f"({values})"
        start = f"INSERT INTO {self.d.insert_table} ({', '.join(INSERT_COLUMNS)}) VALUES "
        statement: list[str] = []
        params: list[Any] = []
        size = 0
        for row_id, args, kwargs in varying:
            if statement and size + len(args) + len(kwargs) > _STATEMENT_BYTES:
                cursor.execute(start + ", ".join(statement), params)
                statement, params, size = [], [], 0
            statement.append(row)
            params += (row_id, args, kwargs)
            size += len(row) + 40 + len(args) + len(kwargs)
        cursor.execute(start + ", ".join(statement), params)


class MySQLDialect(Dialect):
    vendor = "mysql"
    inserts_class = MySQLInserts
    insert_ignore_sql = "INSERT IGNORE INTO {table} ({columns}) VALUES {values}"
    locks_in_union = True
    #: No ``UPDATE ... RETURNING``: the hand-over's claim is built from its read.
    claims_from_read = True
    autocommit_is_a_statement = True
    #: Whether the server is a Galera node (``is_galera``); None: not asked yet.
    galera: bool | None = None
    #: The server's ``max_allowed_packet`` (``refuse_oversized``); None: not asked yet.
    max_packet: int | None = None

    def refuse_oversized(self, cursor: Any, sql: str, params: Sequence[Any]) -> None:
        """A statement over ``max_allowed_packet`` refused here, as the server would.

        Sent, such a statement gets error 1153 and its connection closed, and
        which of the two the client sees first is a race: "server has gone
        away" (2006) or "lost connection" (2013) say nothing of the data, so
        the refusal would be taken for an outage and the outcome retried until
        its lease lapsed (issue 37). Measured before sending (the statement's
        text and its values' bytes, before escaping), it is the same refusal
        every time. One that escaping alone takes over the limit is still sent,
        and still refused by the server.
        """
        if self.max_packet is None:
            cursor.execute("SELECT @@max_allowed_packet")
            self.max_packet = int(cursor.fetchone()[0])
        # A character is at most 4 bytes: the values are encoded to count them
        # only when their lengths alone come near the limit (most never do).
        chars = len(sql) + sum(len(v) if isinstance(v, str | bytes) else 32 for v in params)
        if chars * 4 <= self.max_packet:
            return
        size = len(sql) + sum(_byte_length(value) for value in params)
        if size > self.max_packet:
            raise OperationalError(
                1153,
                f"Got a packet bigger than 'max_allowed_packet' bytes "
                f"(a statement of {size:,} bytes, not sent)",
            )

    def reads_locked(self) -> bool:
        # A Galera node's row locks are its own: there the claims stay
        # optimistic, the version compare-and-set certified cluster-wide.
        if self.galera is None:
            self.galera = self.is_galera()
        return not self.galera

    def now_plus_sql(self, placeholder: str, now: str | None = None) -> str:
        return f"({now or self.now_sql} + INTERVAL {placeholder} MICROSECOND)"

    def accepts_writes(self, cursor: Any) -> bool:
        # A replica is set read_only (MySQL's super_read_only sets it too). A
        # Galera node outside the primary component refuses the query
        # itself, which the caller takes as a failure to retry.
        cursor.execute("SELECT @@global.read_only")
        value = cursor.fetchone()[0]
        # 0/1, or a name where it is an enum (MariaDB 11: OFF, ON, NO_LOCK...).
        return str(value.decode() if isinstance(value, bytes) else value).upper() in {"0", "OFF"}

    def seconds_param(self, seconds: float) -> Any:
        return round(seconds * 1_000_000)

    def json_append_sql(self, column: str, placeholder: str) -> str:
        # MariaDB stores JSON as text; JSON_EXTRACT makes the parameter a JSON
        # value rather than a string, on MySQL and MariaDB alike.
        return f"JSON_ARRAY_APPEND({column}, '$', JSON_EXTRACT({placeholder}, '$'))"

    def refuses_claim_mode(self, mode: ClaimMode) -> str | None:
        if mode == ClaimMode.SKIP_LOCKED and self.is_galera():
            return (
                "--mode skip-locked is refused on a Galera cluster (wsrep_on is ON): "
                "its row locks are local to one node, so workers on other nodes never "
                "see them, claim the same rows and collide at commit, where Galera "
                "fails all but one (error 1213). Use the default optimistic mode, whose "
                "version compare-and-set is certified cluster-wide (docs/galera.md)."
            )
        return None

    def is_galera(self) -> bool:
        """Whether this server replicates with Galera (``wsrep_on``; MySQL has no such variable)."""
        with self.connection.cursor() as cursor:
            cursor.execute("SHOW GLOBAL VARIABLES LIKE 'wsrep_on'")
            row = cursor.fetchone()
        return row is not None and str(row[1]).upper() in {"ON", "1"}

    def limit_hit(self, cursor: Any, refusal: BaseException) -> str | None:
        if mysql_errno(refusal) not in MYSQL_PACKET_TOO_LARGE:
            return None
        cursor.execute("SELECT @@max_allowed_packet")
        return f"the server's max_allowed_packet is {int(cursor.fetchone()[0]):,} bytes"

    def replica_lag(self, cursor: Any) -> float | None:
        """``Seconds_Behind_Master`` (``_Source`` on MySQL); unknown without the privilege."""
        from django.db import DatabaseError

        for statement in ("SHOW REPLICA STATUS", "SHOW SLAVE STATUS"):
            try:
                cursor.execute(statement)
            except DatabaseError:
                continue  # the older spelling, or no REPLICATION CLIENT privilege
            names = [column[0] for column in cursor.description or ()]
            rows = cursor.fetchall()
            if not rows:
                return 0.0  # not a replica: the alias names a primary
            # The first channel's: several sources are beyond what this reports.
            row = dict(zip(names, rows[0], strict=True))
            value = row.get("Seconds_Behind_Source", row.get("Seconds_Behind_Master"))
            return None if value is None else float(value)  # NULL: replication stopped
        return None

    def session_sql(self, lease: float) -> list[str]:
        # No write of a worker waits on a lock for long (claims skip locked
        # rows and never wait at all); 1 s is InnoDB's least.
        statements = [f"SET SESSION innodb_lock_wait_timeout = {max(1, int(lease / 4))}"]
        if getattr(self.connection, "mysql_is_mariadb", False):
            # A frozen worker's open transaction is ended by the server, and
            # its row locks with it. MySQL has no such setting: there only
            # wait_timeout (idle connections) and TCP keepalive end it.
            statements.append(f"SET SESSION idle_transaction_timeout = {max(1, int(lease / 2))}")
            # And no statement of a worker runs past half its lease on a server
            # that answers but slowly. (MySQL's max_execution_time bounds only
            # SELECTs; there the client's read timeout is the bound.)
            statements.append(f"SET SESSION max_statement_time = {max(1, int(lease / 2))}")
        return statements

    def connection_options(self, lease: float) -> dict[str, Any]:
        # The client's own bounds (mysqlclient): a server cut off silently
        # fails a connection attempt, a write and a wait for an answer in
        # seconds. The client tries a timed-out read three times, and a
        # worker's statement may wait ``innodb_lock_wait_timeout`` (lease / 4).
        seconds = max(2, min(10, round(lease / 3)))
        return {"connect_timeout": seconds, "read_timeout": seconds, "write_timeout": seconds}

    def claim_chosen(
        self, cursor: Any, chosen: Sequence[Candidate], worker_id: str, lease: float
    ) -> list[ClaimedRow]:
        ordered = sorted(chosen, key=lambda c: c.id)
        cursor.execute(
            self.claim_update_sql(len(ordered)),
            self.claim_update_params(ordered, worker_id, lease),
        )
        if cursor.rowcount == 0:
            return []
        return self.read_claimed(cursor, ordered, worker_id)

    def read_claimed(
        self, cursor: Any, chosen: Sequence[Candidate], worker_id: str
    ) -> list[ClaimedRow]:
        """The rows of ``chosen`` this transaction claimed, read back (no RETURNING)."""
        marks = ", ".join(["%s"] * len(chosen))
        cursor.execute(
            f"SELECT {', '.join(CLAIM_COLUMNS)} FROM {self.table} "
            f"WHERE id IN ({marks}) AND worker_id = %s",
            [*(c.id for c in chosen), worker_id],
        )
        claimed_versions = {c.id: c.version + 1 for c in chosen}
        return [
            self.decode_claimed(row)
            for row in cursor.fetchall()
            if claimed_versions.get(row[0]) == row[1]
        ]

    @functools.cached_property
    def hand_over_sql(self) -> str:
        """A slot's hand-over and the claim it is for, one UPDATE of both rows.

        Parameters: the claim's time (the row's read's, ``Claimable.read_at``),
        the claimer and the lease; the slot's new holder (the row's id and
        version after the claim), the time and the lease again (the slot's, as
        every claim stamps it); the row's id and version read; the holder's id
        and version. Either both rows are written or neither: the row only if
        it is still claimable at that version, the slot only if that holder
        still holds it and it is among the row's limit's slots. The time is
        the read's so that the claim is known without reading it back
        (``claim_handed``); the lease it starts is the shorter for it.
        """
        assignments = self.claim_assignments(
            "t", "%(worker)s", "%(lease)s", qualified=True, now="%(now)s"
        )
        return (
            f"UPDATE {self.table} AS t, {self.limits.table} AS s SET {assignments}, "
            # (Values, not t's columns: MySQL does not say whether a two-table
            # UPDATE reads t's before or after writing them.)
            "s.holder_id = %(id)s, s.holder_version = %(claimed_version)s, "
            f"s.last_started_at = %(now)s, s.free_at = {self.now_plus_sql('%(lease)s', '%(now)s')} "
            f"WHERE t.id = %(id)s AND t.version = %(version)s AND {self.claimable('t')} "
            "AND s.holder_id = %(holder)s AND s.holder_version = %(holder_version)s "
            "AND s.slot_no < t.limit_count"
        )

    def hand_over_one(
        self, cursor: Any, holder: tuple[Any, int], to: Candidate, request: ClaimRequest
    ) -> bool:
        # The slot and the claim in one statement, at the read's time (``claims_from_read``).
        assert isinstance(to, Claimable), "MySQL's hand-over reads its rows whole"
        cursor.execute(
            self.hand_over_sql,
            {
                "now": to.read_at,
                "worker": request.worker_id,
                "lease": self.seconds_param(request.lease),
                "id": to.id,
                "version": to.version,
                "claimed_version": to.version + 1,
                "holder": holder[0],
                "holder_version": holder[1],
            },
        )
        return cursor.rowcount > 0

    def claim_handed(
        self, cursor: Any, chosen: Sequence[Candidate], worker_id: str, lease: float
    ) -> list[ClaimedRow]:
        """The claims ``hand_over_one`` wrote, as it wrote them: each row was read
        whole and locked, and its claim held (``rowcount``), fenced on the version
        read, so what it holds now is what it was read with and what the claim set."""
        claimed = []
        for c in chosen:
            assert isinstance(c, Claimable), "hand_over_one took it whole"
            claimed.append(self.decode_claimed(c.claimed()))
        return claimed


def _byte_length(value: Any) -> int:
    """What a statement's value adds to it, before escaping."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes):
        return len(value)
    return 32
