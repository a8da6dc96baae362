"""The conditions that say which task rows are READY, and unfinished, as the indexes do.

Each is the condition of a partial index (``tasks.py``): a read that spells
its rows this way is one the index serves. The same conditions as SQL, for
the claim, are in ``db/ready_arms.py``.
"""

from __future__ import annotations

from django.db import connections
from django.db.models import Q

from ..states import TaskStatus

#: READY rows without a limit, enqueued to run at once and never started; and
#: the others, due at a time asked for or between attempts (``db/ready_arms.py``
#: says why they are indexes apart, in the same words as SQL).
READY_FRESH = Q(
    status=TaskStatus.READY,
    limit_key__isnull=True,
    requested_run_after__isnull=True,
    started_at__isnull=True,
)
READY_DEFERRED = Q(status=TaskStatus.READY, limit_key__isnull=True) & (
    Q(requested_run_after__isnull=False) | Q(started_at__isnull=False)
)
#: READY rows held to a limit (``limits.py``).
READY_LIMITED = Q(status=TaskStatus.READY, limit_key__isnull=False)


def ready_conditions(using: str) -> list[Q]:
    """Every READY row, as the database indexes them: one read per condition.

    Where indexes can be partial, ``status = 'READY'`` alone is the condition
    of none of them: PostgreSQL would read the whole table for it (every
    finished row too). Each arm is one index's condition, so a read per arm
    walks that index alone. MySQL and MariaDB have one index of every READY
    row, which the plain condition reaches.
    """
    if connections[using].features.supports_partial_indexes:
        return [READY_FRESH, READY_DEFERRED, READY_LIMITED]
    return [Q(status=TaskStatus.READY)]


def unfinished_rows() -> Q:
    """READY, RUNNING or WAITING, each arm the condition of a partial index."""
    return (
        READY_FRESH
        | READY_DEFERRED
        | READY_LIMITED
        | Q(status=TaskStatus.RUNNING)
        | Q(status=TaskStatus.WAITING)
    )
