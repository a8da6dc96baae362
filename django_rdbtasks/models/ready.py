"""The conditions that say which task rows are READY, and unfinished, as the indexes do.

Each is the condition of a partial index (``tasks.py``): a read that spells
its rows this way is one the index serves. They are made from the arms of
``db/ready_arms.py``, which the claim's reads spell as SQL.
"""

from __future__ import annotations

import functools
import operator

from django.db import connections
from django.db.models import Q

from ..db.ready_arms import DEFERRED_ARM, FRESH_ARM, LIMITED_ARM, ReadyArm
from ..states import TaskStatus


def ready_arm(arm: ReadyArm) -> Q:
    """READY rows of ``arm``, as the ORM's condition (the same Q the indexes were made with)."""
    condition = Q(
        status=TaskStatus.READY,
        **{f"{column}__isnull": True for column in arm.null},
        **{f"{column}__isnull": False for column in arm.not_null},
    )
    if arm.any_not_null:
        condition &= functools.reduce(
            operator.or_, (Q(**{f"{column}__isnull": False}) for column in arm.any_not_null)
        )
    return condition


#: READY rows without a limit, enqueued to run at once and never started; and
#: the others, due at a time asked for or between attempts (``db/ready_arms.py``
#: says why they are indexes apart).
READY_FRESH = ready_arm(FRESH_ARM)
READY_DEFERRED = ready_arm(DEFERRED_ARM)
#: READY rows held to a limit (``limits.py``).
READY_LIMITED = ready_arm(LIMITED_ARM)


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
