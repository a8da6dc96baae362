"""Queues an operator paused (``queues.py``): no worker claims from them until resumed."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..db.functions import DbNow


class PausedQueue(models.Model):
    """A paused queue: its row is the pause, deleting it the resume.

    Per database, by queue name: every backend whose tasks are in this
    database and use the name is paused alike.
    """

    queue_name = models.CharField(_("queue"), max_length=100, unique=True)
    paused_at = models.DateTimeField(_("paused at"), db_default=DbNow())
    #: Who paused it: a user name, or what the caller said.
    paused_by = models.CharField(_("paused by"), max_length=150, blank=True, default="")
    reason = models.CharField(_("reason"), max_length=200, blank=True, default="")

    class Meta:
        verbose_name = _("paused queue")
        verbose_name_plural = _("paused queues")
        permissions = [("pause_queue", _("Can pause and resume queues"))]

    def __str__(self) -> str:
        return self.queue_name
