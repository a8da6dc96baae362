"""What a database error means for the worker, decided in one place.

- A **lost race** (``is_lost_race``): another transaction won. The database
  rolled ours back whole; doing it again is the remedy, at once.
- A **refusal** (``is_refusal``): the database, or its driver before the
  statement left, refused the data. The same write fails again however often
  it is tried, so retrying it would stall whoever waits on it: the worker
  finds the task whose data it was, and fails that task alone
  (``worker/store.py``).
- Anything else is an **outage** (a lost connection, a server restarting,
  read-only after a failover, a lock or statement timeout, a missing table
  before ``migrate``): retried with backoff, as long as it lasts.

Decided by the driver's error class, PostgreSQL's SQLSTATE and MySQL's error
number, never by the message's text. Django wraps the driver's exception
(``__cause__``) and copies its ``args``; the whole chain is looked at.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db import DataError, IntegrityError

#: MySQL/MariaDB: ER_LOCK_DEADLOCK. InnoDB rolled the whole transaction back;
#: Galera also reports a certification conflict (at COMMIT, or a local
#: transaction aborted by a replicated one that won) with this code.
MYSQL_LOST_RACE = frozenset({1213})
#: PostgreSQL: serialization_failure, deadlock_detected.
SQLSTATE_LOST_RACE = frozenset({"40001", "40P01"})

#: PostgreSQL's classes of errors about the data: 22 data exception (a NUL
#: or a lone surrogate in JSON, a value too long or out of range), 23
#: integrity constraint violation, 54 program limit exceeded (a jsonb value
#: over 255 MiB, too many columns or parameters).
SQLSTATE_REFUSED_CLASSES = frozenset({"22", "23", "54"})
#: MySQL and MariaDB error numbers that refuse the data.
MYSQL_REFUSED = frozenset(
    {
        1048,  # ER_BAD_NULL_ERROR: a NOT NULL column given NULL (a JSON function's NULL)
        1153,  # ER_NET_PACKET_TOO_LARGE: a statement over max_allowed_packet
        1264,  # ER_WARN_DATA_OUT_OF_RANGE
        1265,  # WARN_DATA_TRUNCATED
        1292,  # ER_TRUNCATED_WRONG_VALUE: an impossible date, say
        1300,  # ER_INVALID_CHARACTER_STRING
        1301,  # ER_WARN_ALLOWED_PACKET_OVERFLOWED: a function's result over max_allowed_packet
        1366,  # ER_TRUNCATED_WRONG_VALUE_FOR_FIELD: an incorrect string value
        1367,  # ER_ILLEGAL_VALUE_FOR_TYPE
        1406,  # ER_DATA_TOO_LONG
        1411,  # ER_WRONG_VALUE_FOR_TYPE
        1441,  # ER_DATETIME_FUNCTION_OVERFLOW: a date past 9999
        1690,  # ER_DATA_OUT_OF_RANGE
        3819,  # MySQL ER_CHECK_CONSTRAINT_VIOLATED
        4025,  # MariaDB ER_CONSTRAINT_FAILED: its JSON columns' CHECK (json_valid)
        *range(3140, 3161),  # MySQL's JSON errors: invalid JSON text, in a parameter...
        *range(4035, 4050),  # MariaDB's JSON errors: syntax, escaping, depth...
    }
)
#: The ones that say a limit of the server's was hit (its value is worth saying).
MYSQL_PACKET_TOO_LARGE = frozenset({1153, 1301})


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes (Django's wrapper, then the driver's error)."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__


def mysql_errno(exc: BaseException) -> int | None:
    """The MySQL/MariaDB error number of ``exc`` (or its cause), if it has one."""
    for error in _chain(exc):
        args = getattr(error, "args", ())
        if args and type(args[0]) is int:
            return args[0]
    return None


def sqlstate(exc: BaseException) -> str | None:
    """PostgreSQL's SQLSTATE of ``exc`` (or its cause), if it has one."""
    for error in _chain(exc):
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if state:
            return str(state)
    return None


def is_lost_race(exc: BaseException) -> bool:
    """Whether ``exc`` says another transaction won, not that the database is unwell.

    The transaction was rolled back as a whole and doing it again is the
    remedy: a deadlock, a serialization failure, or on Galera a write that
    lost certification to a conflicting one committed on another node. The
    chain also makes a ``TransactionManagementError`` raised because an earlier
    statement of the transaction lost a race count as one.
    """
    for error in _chain(exc):
        args = getattr(error, "args", ())
        if args and isinstance(args[0], int) and args[0] in MYSQL_LOST_RACE:
            return True
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if state in SQLSTATE_LOST_RACE:
            return True
    return False


def is_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` refuses the data written, so the same write would fail again.

    - Django's ``DataError`` and ``IntegrityError``: the drivers raise them for
      a value the column cannot take (psycopg also for a NUL in a text
      parameter, before sending anything).
    - PostgreSQL SQLSTATE classes 22, 23 and 54 (``SQLSTATE_REFUSED_CLASSES``),
      whatever class the driver gave the error.
    - MySQL and MariaDB error numbers in ``MYSQL_REFUSED`` (a packet too big
      is an ``OperationalError``; invalid JSON for MariaDB's JSON functions too).
    - A value the driver could not put into the statement: a ``UnicodeError``
      (a lone surrogate in a text parameter), or mysqlclient's
      ``ProgrammingError`` with no error number (``nan can not be used``).
    """
    if is_lost_race(exc):
        return False
    for error in _chain(exc):
        if isinstance(error, DataError | IntegrityError | UnicodeError):
            return True
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if state and str(state)[:2] in SQLSTATE_REFUSED_CLASSES:
            return True
        args = getattr(error, "args", ())
        if args and type(args[0]) is int and args[0] in MYSQL_REFUSED:
            return True
        if _mysql_client_refusal(error):
            return True
    return False


def _mysql_client_refusal(error: BaseException) -> bool:
    """mysqlclient refusing a parameter before sending: its ProgrammingError, no number."""
    kind = type(error)
    if kind.__name__ != "ProgrammingError" or not kind.__module__.startswith("MySQLdb"):
        return False
    args = error.args
    return not (args and type(args[0]) is int)


def describe(exc: BaseException) -> str:
    """The error's class and code, and its message: ``DataError (SQLSTATE 22P05): ...``.

    The message may be long (a driver quotes the statement) and hold what
    was refused: callers bound and clean it (``storable.readable_text``).
    """
    code = ""
    state = sqlstate(exc)
    if state:
        code = f" (SQLSTATE {state})"
    else:
        errno = mysql_errno(exc)
        if errno is not None:
            code = f" (MySQL error {errno})"
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}{code}: {message}" if message else f"{type(exc).__name__}{code}"
