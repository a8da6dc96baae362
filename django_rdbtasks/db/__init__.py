"""Database-specific SQL of the claim protocol, one module per database."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import Dialect

_dialects: dict[tuple[str, str], Dialect] = {}


def dialect_for(connection: Any) -> Dialect:
    key = (connection.alias, connection.vendor)
    dialect = _dialects.get(key)
    if dialect is None:
        cls: type[Dialect]
        if connection.vendor == "postgresql":
            from .postgresql import PostgreSQLDialect

            cls = PostgreSQLDialect
        elif connection.vendor == "mysql":
            from .mysql import MySQLDialect

            cls = MySQLDialect
        elif connection.vendor == "sqlite":
            from .sqlite import SQLiteDialect

            cls = SQLiteDialect
        else:
            raise NotImplementedError(
                f"django-rdbtasks does not support the {connection.vendor!r} database."
            )
        dialect = _dialects[key] = cls(connection)
    return dialect


def forget_what_claims_learnt() -> None:
    """Every dialect's claims start afresh: one test's contention is not the next's."""
    for dialect in _dialects.values():
        dialect.forget_learnt()
