"""What each limit key holds now: slots in use, tasks waiting (the admin's and the metrics')."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Max, Q

from .db.functions import DbNow
from .models import LimitSlot, Task, TaskStatus
from .states import LimitKind

#: At most this many keys, busiest first: argument-derived keys can be many.
MAX_KEYS = 500


@dataclass(frozen=True, slots=True)
class KeyUsage:
    key: str  # as stored: the kind, a colon, the key
    slots: int  # the limit: N running at once, or N starts per period
    period: float  # seconds; 0 for a concurrency limit
    in_use: int  # running now (concurrency), or started in the last period (rate)
    waiting: int  # READY tasks of the key, due or not

    @property
    def kind(self) -> LimitKind:
        return LimitKind.RATE if self.period > 0 else LimitKind.CONCURRENCY

    @property
    def name(self) -> str:
        """The key without its kind."""
        return self.key.split(":", 1)[1] if ":" in self.key else self.key

    @property
    def full(self) -> bool:
        return self.in_use >= self.slots


def key_usage(using: str, limit: int = MAX_KEYS) -> list[KeyUsage]:
    """Every key with a slot in use or a task waiting, busiest first.

    A slot is in use while its ``free_at`` is ahead of the database clock: a
    running holder's lease (concurrency), or a period after a start (rate).
    The waiting count reads the READY rows that have a limit key: a scan of
    the READY rows, fine for a page an operator opens, not for every claim.
    A key whose tasks wait before any worker made its slots (or made the ones
    a raised limit adds) shows the limit its tasks carry.
    """
    slots: dict[str, Any] = {
        str(s["key"]): s
        for s in LimitSlot.objects.using(using)
        .values("key")
        .annotate(
            slots=Count("id"),
            period=Max("period"),
            in_use=Count("id", filter=Q(free_at__gt=DbNow())),
        )
    }
    waiting: dict[str, Any] = {
        str(w["limit_key"]): w
        for w in Task.objects.using(using)
        .filter(status=TaskStatus.READY, limit_key__isnull=False)
        .values("limit_key")
        .annotate(n=Count("id"), count=Max("limit_count"), period=Max("limit_period"))
    }
    rows = []
    for key in slots.keys() | waiting.keys():
        s, w = slots.get(key), waiting.get(key)
        in_use = s["in_use"] if s else 0
        if not in_use and not w:
            continue
        count = max(s["slots"] if s else 0, (w["count"] or 0) if w else 0)
        period = (s["period"] if s else None) or (w["period"] if w else None) or 0.0
        rows.append(KeyUsage(key, count, period, in_use, w["n"] if w else 0))
    rows.sort(key=lambda u: (-u.in_use, -u.waiting, u.key))
    return rows[:limit]
