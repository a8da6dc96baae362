"""PostgreSQL: its dialect, and the parts the dialect is made of, one module each."""

from .dialect import PostgreSQLDialect

__all__ = ["PostgreSQLDialect"]
