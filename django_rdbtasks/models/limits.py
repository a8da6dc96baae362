"""The slots of concurrency and rate limits (limits.py, db/limits.py)."""

from __future__ import annotations

import datetime as dt

from django.db import models
from django.utils.translation import gettext_lazy as _


class LimitSlot(models.Model):
    """One of the N slots of a limit key: a claim of a limited task takes a free one.

    Free when ``free_at`` is NULL or past (database clock). A concurrency
    slot is held until its task's outcome (``free_at`` follows the lease,
    renewed with it); a rate slot is free again ``period`` after its start.
    Every decision reads this row's own columns under its row lock.
    """

    key = models.CharField(max_length=200)
    slot_no = models.PositiveIntegerField()
    #: Seconds between two starts on this slot; 0 for a concurrency slot.
    period = models.FloatField(default=0)
    free_at = models.DateTimeField(null=True, blank=True)
    last_started_at = models.DateTimeField(null=True, blank=True)
    #: The claim holding a concurrency slot: its task and claimed version.
    holder_id = models.UUIDField(null=True, blank=True)
    holder_version = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        verbose_name = _("limit slot")
        verbose_name_plural = _("limits")
        constraints = [
            models.UniqueConstraint(fields=["key", "slot_no"], name="rdbtasks_limit_slot"),
        ]
        indexes = [models.Index(fields=["holder_id"], name="rdbtasks_limit_holder")]

    def __str__(self) -> str:
        return f"{self.key}#{self.slot_no}"

    def is_free(self, now: dt.datetime) -> bool:
        """Whether a claim may take it at ``now`` (the database clock), as the claim decides."""
        return self.free_at is None or self.free_at <= now
