"""SQLite (development): one writer at a time, ``RETURNING`` since 3.35.

There are no row locks to skip: a writer holds the whole database, so a round
(finish, then claim) is one write transaction and the compare-and-set on the
version is exact. A process frozen inside a write transaction stops every
writer until SQLite's busy timeout: one more reason SQLite is for development.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..states import ClaimMode
from .base import CLAIM_COLUMNS, Candidate, ClaimedRow, Dialect, Exchange


class SQLiteDialect(Dialect):
    vendor = "sqlite"
    has_row_locks = False

    def refuses_claim_mode(self, mode: ClaimMode) -> str | None:
        if mode == ClaimMode.SKIP_LOCKED:
            return (
                "--mode skip-locked needs SELECT ... FOR UPDATE SKIP LOCKED, which SQLite "
                "does not have; use the default optimistic mode on SQLite."
            )
        return None

    def now_plus_sql(self, placeholder: str, now: str | None = None) -> str:
        # A pinned clock's literal is a time value STRFTIME reads as it reads 'NOW'.
        moment = now or (self.now_sql if self.clock_pinned else "'NOW'")
        return f"STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', {moment}, {placeholder})"

    def seconds_param(self, seconds: float) -> Any:
        return f"{seconds:+.6f} seconds"

    def json_append_sql(self, column: str, placeholder: str) -> str:
        return f"json_insert({column}, '$[#]', json({placeholder}))"

    def lock_unchanged(
        self, cursor: Any, candidates: Sequence[Candidate], want: int
    ) -> list[Candidate]:
        # Nothing to lock: the claim's UPDATE compares the versions itself.
        return list(candidates[:want])

    def locked_candidates(
        self,
        cursor: Any,
        queues: Sequence[str],
        limit: int,
        found: Exchange | None = None,
    ) -> list[Candidate]:
        raise NotImplementedError("SQLite has no SELECT ... FOR UPDATE SKIP LOCKED.")

    def claim_chosen(
        self, cursor: Any, chosen: Sequence[Candidate], worker_id: str, lease: float
    ) -> list[ClaimedRow]:
        cursor.execute(
            f"{self.claim_update_sql(len(chosen))} RETURNING {', '.join(CLAIM_COLUMNS)}",
            self.claim_update_params(chosen, worker_id, lease),
        )
        return [self.decode_claimed(row) for row in cursor.fetchall()]
