"""MySQL and MariaDB: no RETURNING on UPDATE, so a claim is read back by its mark.

The mark is the pair our claim wrote: our ``worker_id`` and the candidate's
version plus one. Only this worker's claiming thread writes that pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import CLAIM_COLUMNS, RUNNING, Candidate, ClaimedRow, Dialect


class MySQLDialect(Dialect):
    vendor = "mysql"
    now_sql = "UTC_TIMESTAMP(6)"

    def now_plus_sql(self, placeholder: str) -> str:
        return f"({self.now_sql} + INTERVAL {placeholder} MICROSECOND)"

    def seconds_param(self, seconds: float) -> Any:
        return round(seconds * 1_000_000)

    def json_append_sql(self, column: str, placeholder: str) -> str:
        # MariaDB stores JSON as text; JSON_EXTRACT makes the parameter a JSON
        # value rather than a string, on MySQL and MariaDB alike.
        return f"JSON_ARRAY_APPEND({column}, '$', JSON_EXTRACT({placeholder}, '$'))"

    def _claim(
        self, cursor: Any, candidates: Sequence[Candidate], worker_id: str, lease: float
    ) -> list[ClaimedRow]:
        ordered = sorted(candidates, key=lambda c: c.id)
        cursor.execute(
            self.claim_update_sql(len(ordered)),
            self.claim_update_params(ordered, worker_id, lease),
        )
        if cursor.rowcount == 0:
            return []
        marks = ", ".join(["%s"] * len(ordered))
        cursor.execute(
            f"SELECT {', '.join(CLAIM_COLUMNS)} FROM {self.table} "
            f"WHERE id IN ({marks}) AND worker_id = %s AND status = '{RUNNING}'",
            [*(c.id for c in ordered), worker_id],
        )
        claimed_versions = {c.id: c.version + 1 for c in ordered}
        return [
            self.decode_claimed(row)
            for row in cursor.fetchall()
            if claimed_versions.get(row[0]) == row[1]
        ]
