"""SQLite (development): one writer at a time, ``RETURNING`` since 3.35."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import CLAIM_COLUMNS, Candidate, ClaimedRow, Dialect


class SQLiteDialect(Dialect):
    vendor = "sqlite"
    # Django stores aware datetimes as UTC text in this shape.
    now_sql = "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')"

    def now_plus_sql(self, placeholder: str) -> str:
        return f"STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW', {placeholder})"

    def seconds_param(self, seconds: float) -> Any:
        return f"{seconds:+.6f} seconds"

    def json_append_sql(self, column: str, placeholder: str) -> str:
        return f"json_insert({column}, '$[#]', json({placeholder}))"

    def _claim(
        self, cursor: Any, candidates: Sequence[Candidate], worker_id: str, lease: float
    ) -> list[ClaimedRow]:
        cursor.execute(
            f"{self.claim_update_sql(len(candidates))} RETURNING {', '.join(CLAIM_COLUMNS)}",
            self.claim_update_params(candidates, worker_id, lease),
        )
        return [self.decode_claimed(row) for row in cursor.fetchall()]
