"""A worker session that does not turn autocommit on and off around each transaction.

On MySQL and MariaDB, Django's ``transaction.atomic`` turns autocommit off as
it opens a transaction and on again after the commit: ``SET autocommit=0``,
the transaction's statements, ``COMMIT``, ``SET autocommit=1``. Each is a
round trip, so a lane's round (a transaction of a few statements) pays two
more than its work. A worker's own session (``connection.open_in_thread``)
runs one round after another, so here autocommit is left off after a
transaction, where the next transaction wants it (a transaction then begins
with its first statement and ends with ``COMMIT``, as before), and turned on
again only when a statement is about to run outside any transaction: the
session's ORM writes outside ``atomic`` still commit as they run.

PostgreSQL (psycopg) and SQLite begin a transaction without a round trip of
its own; they keep Django's wrapper as it is.
"""

from __future__ import annotations

from typing import Any

_made: dict[type, type] = {}


def without_autocommit_toggles(wrapper_class: type) -> type:
    """A subclass of the backend's ``DatabaseWrapper`` (MySQL's) that leaves
    autocommit off between transactions (made once per class)."""
    made = _made.get(wrapper_class)
    if made is not None:
        return made

    class LazyAutocommitWrapper(wrapper_class):
        def _set_autocommit(self, autocommit: bool) -> None:
            if autocommit:
                # After a transaction (or at connect): owed, paid by ``_cursor``
                # before a statement that runs outside a transaction.
                return
            if not self.connection.get_autocommit():
                return  # still off since the last transaction: nothing to send
            super()._set_autocommit(False)

        def _cursor(self, name: Any = None) -> Any:
            self.ensure_connection()
            if self.autocommit and not self.connection.get_autocommit():
                # Django holds the session in autocommit: make the driver agree
                # before this statement, or it would open a transaction that
                # nothing commits.
                super()._set_autocommit(True)
            return super()._cursor(name)

    LazyAutocommitWrapper.__qualname__ = f"{wrapper_class.__qualname__}WithoutAutocommitToggles"
    _made[wrapper_class] = LazyAutocommitWrapper
    return LazyAutocommitWrapper
