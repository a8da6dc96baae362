"""The order the claim takes runnable rows in, defined once.

Expired leases first (``reclaim``: 0 for a lapsed lease, 1 for a READY row),
then the higher priority, then the earlier ``run_after``, limited or not.
Every statement that orders rows for the claim spells it from here (the
PostgreSQL round, ``postgresql/round.py`` and ``postgresql/limited.py``; the portable reads,
``ready_reads.py``; the compare-and-set, ``base.py``), the portable claim
merges its reads in Python by ``sort_key``, and the indexes the claim reads
(``models.tasks``) end in the same columns (``index_fields``), so that each
read is a range of its index in the index's own order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class OrderedColumn:
    """A column of the claim order, and its direction."""

    column: str
    descending: bool = False

    def sql(self, alias: str = "") -> str:
        prefix = f"{alias}." if alias else ""
        return f"{prefix}{self.column}{' DESC' if self.descending else ''}"

    def index_field(self) -> str:
        """As a Django index names it (``-`` for descending)."""
        return f"-{self.column}" if self.descending else self.column


#: READY rows among themselves: the higher priority first, then the earlier due.
READY_ORDER = (OrderedColumn("priority", descending=True), OrderedColumn("run_after"))
#: Expired leases (0) before READY rows (1): a dead holder's task runs again first.
RECLAIM = OrderedColumn("reclaim")
#: The whole order, as the reads name their columns.
ORDER = (RECLAIM, *READY_ORDER)


def ready_order(alias: str = "", *, after: Sequence[str] = ()) -> str:
    """``priority DESC, run_after`` (columns of ``alias``, if given), after the SQL
    expressions ``after`` (an index's leading column, the reclaim's)."""
    return ", ".join([*after, *(column.sql(alias) for column in READY_ORDER)])


def claim_order(reclaim: str = RECLAIM.column) -> str:
    """The claim order as SQL; ``reclaim``: what puts the expired leases first (a
    column of the reads, or an expression over the status)."""
    return ready_order(after=[reclaim])


#: The claim order of the rows the round's reads give (``reclaim`` is a column of theirs).
CLAIM_ORDER = claim_order()


def index_fields(*leading: str) -> list[str]:
    """The fields of an index the claim reads in its order: ``leading``, then the order's."""
    return [*leading, *(column.index_field() for column in READY_ORDER)]


def sort_key(reclaim: int, priority: int, run_after: Any) -> tuple[Any, ...]:
    """One row's place in the claim order, as Python sorts (``CLAIM_ORDER``'s)."""
    values = (reclaim, priority, run_after)
    return tuple(
        -value if column.descending else value for column, value in zip(ORDER, values, strict=True)
    )
