"""How a worker's PostgreSQL sessions are bounded, per session or per pooled transaction,
and named (``application_name``, shown in ``pg_stat_activity``).

A frozen or partitioned worker must not keep a transaction (and its row locks)
open, wait on a lock, or run a statement past a fraction of its lease; and it
must notice a vanished server instead of waiting on a socket that never
answers (``worker/connection.py`` applies these).

Its statements are never compiled by JIT either. A round is a few
milliseconds of work, but over a table of a million rows its plan's cost
estimate can pass ``jit_above_cost`` (100,000 by default: the planner cannot
know that the few READY rows due now are all a LIMIT reaches), and the
server then spends about 30 ms compiling every round: measured, a round of
6 ms took 34 on such a table (docs/benchmarks.md, 2026-11-27 23:14).
"""

from __future__ import annotations

from typing import Any

#: The longest ``application_name`` the server keeps (NAMEDATALEN - 1 bytes; it
#: shows each byte outside printable ASCII as ``?``).
APPLICATION_NAME_LENGTH = 63


class PostgreSQLSessionBounds:
    @staticmethod
    def _bounds(lease: float) -> tuple[int, int]:
        # A frozen or partitioned worker must not keep a transaction (and its
        # row locks) open for longer than a fraction of its lease, none of
        # its own writes may wait on a lock without a bound, and none of its
        # statements may run (on a server that answers, but slowly) past
        # half its lease: its heartbeat would otherwise be late unnoticed.
        # Milliseconds; the first bounds idle time and statements alike.
        return max(1000, int(lease * 500)), max(500, min(5000, int(lease * 250)))

    def session_sql(self, lease: float) -> list[str]:
        idle, lock = self._bounds(lease)
        return [
            f"SET idle_in_transaction_session_timeout = {idle}",
            f"SET lock_timeout = {lock}",
            f"SET statement_timeout = {idle}",
            "SET jit = off",
            # The server notices a vanished client within ~15 s.
            "SET tcp_keepalives_idle = 5",
            "SET tcp_keepalives_interval = 2",
            "SET tcp_keepalives_count = 5",
        ]

    def transaction_sql(self, lease: float) -> list[str]:
        # set_config(..., true) is SET LOCAL: gone at COMMIT or ROLLBACK, so
        # the pooled server session goes back to the next client untouched.
        # The server-side keepalives have no per-transaction form; the
        # pooler's own keepalives and timeouts take their place.
        idle, lock = self._bounds(lease)
        return [
            f"SELECT set_config('idle_in_transaction_session_timeout', '{idle}', true), "
            f"set_config('lock_timeout', '{lock}', true), "
            f"set_config('statement_timeout', '{idle}', true), "
            "set_config('jit', 'off', true)"
        ]

    def connection_options(self, lease: float) -> dict[str, Any]:
        # And the worker notices a vanished server, instead of waiting on a
        # socket that will never answer; a connection attempt to a server cut
        # off silently (its SYNs dropped) ends too, instead of the kernel's
        # two minutes of retries (libpq's least is 2 s).
        return {
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 5,
            "tcp_user_timeout": max(5000, int(lease * 500)),
            "connect_timeout": max(2, min(10, round(lease / 3))),
        }

    def naming_options(self, role: str, configured: dict[str, Any]) -> dict[str, Any]:
        # pg_stat_activity shows a session's application_name: an operator
        # tells a lane's rounds from its writer, the lease keeper or the
        # listener, and the worker process, by it. A name the settings give
        # (the project's own) is kept in front. Sent at connection, so a
        # transaction pooler passes it on as it does the client's own.
        own = str(configured.get("application_name") or "")
        name = f"{own} {role}" if own else role
        return {"application_name": name[:APPLICATION_NAME_LENGTH]}
