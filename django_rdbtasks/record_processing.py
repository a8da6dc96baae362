"""Record processors: every row of your own table processed on a schedule.

Each record is checked out by one holder at a time. The classic case: a
table of devices, each to be polled every 15 minutes by any of several app
servers, never by two at once, and a crashed server's devices must come
back. Add ``CheckoutMixin`` to the model, use ``CheckoutManager``, and
register a processor::

    class Device(CheckoutMixin):
        name = models.CharField(max_length=100)
        objects = CheckoutManager()

    @record_processor(Device, every=timedelta(minutes=15))
    def poll(device): ...

``runworkers`` runs every registered processor in each worker process. Check-
outs use the same protocol as tasks: a compare-and-set on ``checkout_version``
(or ``SELECT ... FOR UPDATE SKIP LOCKED``), a lease from the database clock
renewed while the record is processed, and a check-in fenced by the holder and
version, so a holder that lost its lease cannot check in.
"""

from __future__ import annotations

import logging
import random
import threading
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from django.db import DatabaseError, connections, models, router, transaction
from django.db.models import F, Q
from django.utils.translation import gettext_lazy as _

from .db.functions import DbNow
from .retrying import LeaseRenewer, retry_database

logger = logging.getLogger("django_rdbtasks.record_processing")

M = TypeVar("M", bound="CheckoutMixin")


class CheckoutStatus(models.TextChoices):
    IDLE = "IDLE", _("Idle")
    CHECKED_OUT = "CHECKED_OUT", _("Checked out")


class CheckoutQuerySet(models.QuerySet[M]):
    def due(self) -> CheckoutQuerySet[M]:
        """Idle and due, or checked out by a holder whose lease has run out."""
        return self.filter(
            Q(checkout_status=CheckoutStatus.IDLE, next_due_at__lte=DbNow())
            | Q(checkout_status=CheckoutStatus.CHECKED_OUT, checkout_expires_at__lte=DbNow())
        )

    def checked_out_by(self, holder: str) -> CheckoutQuerySet[M]:
        return self.filter(checkout_status=CheckoutStatus.CHECKED_OUT, checked_out_by=holder)

    def check_out(
        self, holder: str, *, limit: int = 10, lease: float = 60.0, mode: str = "optimistic"
    ) -> list[M]:
        """Check out up to ``limit`` due records for ``holder``; return those won."""
        claim = {
            "checkout_status": CheckoutStatus.CHECKED_OUT,
            "checked_out_by": holder,
            "checkout_expires_at": DbNow() + timedelta(seconds=lease),
            "checkout_status_changed_at": DbNow(),
            "checkout_version": F("checkout_version") + 1,
        }
        won: list[tuple[Any, int]] = []
        if mode == "skip-locked":
            with transaction.atomic(using=self.db):
                rows = list(
                    self.due()
                    .order_by("next_due_at")
                    .select_for_update(skip_locked=True)
                    .values_list("pk", "checkout_version")[:limit]
                )
                if rows:
                    self.filter(pk__in=[pk for pk, _ in rows]).update(**claim)
                won = [(pk, version + 1) for pk, version in rows]
        else:
            found = list(
                self.due()
                .order_by("next_due_at")
                .values_list("pk", "checkout_version")[: limit * 4]
            )
            if found:
                start = random.randrange(len(found))
                for pk, version in (found[start:] + found[:start])[:limit]:
                    if self.due().filter(pk=pk, checkout_version=version).update(**claim):
                        won.append((pk, version + 1))
        versions = dict(won)
        records = list(self.filter(pk__in=versions, checked_out_by=holder))
        return [r for r in records if versions.get(r.pk) == r.checkout_version]

    def renew_checkouts(self, holder: str, pks: Iterable[Any], lease: float) -> int:
        """Extend the leases of those of ``pks`` that ``holder`` still has checked out."""
        return (
            self.checked_out_by(holder)
            .filter(pk__in=list(pks))
            .update(checkout_expires_at=DbNow() + timedelta(seconds=lease))
        )


class CheckoutManager(models.Manager.from_queryset(CheckoutQuerySet)):  # type: ignore[misc]
    pass


class CheckoutMixin(models.Model):
    """Fields and methods for records that are checked out, processed and checked in."""

    checkout_status = models.CharField(
        max_length=16, choices=CheckoutStatus.choices, default=CheckoutStatus.IDLE
    )
    checkout_status_changed_at = models.DateTimeField(null=True, blank=True)
    next_due_at = models.DateTimeField(db_default=DbNow(), db_index=True)
    checked_out_by = models.CharField(max_length=200, blank=True, default="")
    checkout_expires_at = models.DateTimeField(null=True, blank=True)
    checkout_version = models.PositiveBigIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")

    objects = CheckoutManager()

    class Meta:
        abstract = True

    def _mine(self) -> models.QuerySet:
        return type(self)._default_manager.filter(
            pk=self.pk,
            checkout_status=CheckoutStatus.CHECKED_OUT,
            checked_out_by=self.checked_out_by,
            checkout_version=self.checkout_version,
        )

    def renew_checkout(self, lease: float = 60.0) -> bool:
        """Extend the lease; False if the record is no longer ours."""
        return bool(self._mine().update(checkout_expires_at=DbNow() + timedelta(seconds=lease)))

    def check_in(self, *, next_due_in: timedelta, error: str = "") -> bool:
        """Hand the record back, due again after ``next_due_in``; False if it was not ours."""
        return bool(
            self._mine().update(
                checkout_status=CheckoutStatus.IDLE,
                checkout_status_changed_at=DbNow(),
                next_due_at=DbNow() + next_due_in,
                checked_out_by="",
                checkout_expires_at=None,
                checkout_version=F("checkout_version") + 1,
                last_error=error,
            )
        )


@dataclass(frozen=True)
class RecordProcessor:
    model: type[CheckoutMixin]
    function: Callable[[Any], Any]
    every: timedelta
    batch: int = 10
    lease: float = 60.0
    retry_after: timedelta | None = None

    @property
    def name(self) -> str:
        return f"{self.function.__module__}.{self.function.__qualname__}"


_processors: dict[str, RecordProcessor] = {}


def record_processor(
    model: type[CheckoutMixin],
    *,
    every: timedelta,
    batch: int = 10,
    lease: float = 60.0,
    retry_after: timedelta | None = None,
) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Register ``function(record)`` to run on each due record, every ``every``.

    A record whose processing raises is checked in with the error and is due
    again after ``retry_after`` (default: ``every``).
    """

    def register(function: Callable[[Any], Any]) -> Callable[[Any], Any]:
        processor = RecordProcessor(model, function, every, batch, lease, retry_after)
        _processors[processor.name] = processor
        return function

    return register


def registered_processors() -> list[RecordProcessor]:
    return list(_processors.values())


def run_processor(
    processor: RecordProcessor,
    holder: str,
    stopping: threading.Event,
    *,
    poll_interval: float = 1.0,
    mode: str = "optimistic",
) -> None:
    """Check out, process and check in due records until ``stopping`` is set."""
    manager = processor.model._default_manager
    alias = router.db_for_write(processor.model)

    def check_out() -> list[Any]:
        return manager.check_out(holder, limit=processor.batch, lease=processor.lease, mode=mode)

    try:
        while not stopping.is_set():
            records = retry_database(
                check_out, f"{processor.name}: check-out", alias=alias, stop=stopping, log=logger
            )
            if records is None:
                break  # stopping while the database was away
            if not records:
                stopping.wait(poll_interval)
                continue
            _process_batch(processor, records, holder, alias, stopping)
    finally:
        connections.close_all()


class _Waiting:
    """The records of a batch not yet checked in, whose leases one thread renews.

    A batch is checked out at once but processed one record after another: a
    record waiting behind slow ones would otherwise lapse, be checked out by
    another process, lapse again in that one's batch, and so on, never
    processed while a loaded machine keeps every batch slower than the lease.
    """

    def __init__(self, records: Sequence[Any]) -> None:
        self._lock = threading.Lock()
        self._pks = {record.pk for record in records}

    def done(self, record: Any) -> None:
        with self._lock:
            self._pks.discard(record.pk)

    def renew(self, manager: Any, holder: str, lease: float) -> bool:
        with self._lock:
            pks = list(self._pks)
        if pks:
            manager.renew_checkouts(holder, pks, lease)
        return True  # a record lost to another holder is found out before its turn


def _process_batch(
    processor: RecordProcessor,
    records: Sequence[Any],
    holder: str,
    alias: str,
    stopping: threading.Event,
) -> None:
    manager = processor.model._default_manager
    waiting = _Waiting(records)
    renewer = LeaseRenewer(
        lambda: waiting.renew(manager, holder, processor.lease),
        interval=processor.lease / 3,
        name=f"rdbtasks-checkout-{holder}",
        alias=alias,
    ).start()
    try:
        for record in records:
            if stopping.is_set():
                # Give the rest back, due at once, for another process.
                _give_back(processor, record)
            else:
                _process_one(processor, record)
            waiting.done(record)
    finally:
        renewer.stop()


def _give_back(processor: RecordProcessor, record: Any) -> None:
    try:
        record.check_in(next_due_in=timedelta(0), error=record.last_error)
    except DatabaseError as exc:
        logger.warning(
            "%s: could not give %s back (%s); its lease will expire", processor.name, record.pk, exc
        )


def _process_one(processor: RecordProcessor, record: Any) -> None:
    # Its batch's renewals may have failed for longer than the lease (the
    # database away) and another holder taken it: confirm it is still ours
    # (and extend the lease) before touching it.
    try:
        if not record.renew_checkout(processor.lease):
            logger.info("%s: record %s was reclaimed before its turn", processor.name, record.pk)
            return
    except DatabaseError as exc:
        logger.warning("%s: could not renew %s (%s); skipping it", processor.name, record.pk, exc)
        return
    error = ""
    try:
        processor.function(record)
    except Exception:
        error = traceback.format_exc()
        logger.warning("%s: record %s failed:\n%s", processor.name, record.pk, error)
    next_due = processor.every if not error else (processor.retry_after or processor.every)
    try:
        if not record.check_in(next_due_in=next_due, error=error):
            logger.warning(
                "%s: record %s was reclaimed by another holder; check-in discarded",
                processor.name,
                record.pk,
            )
    except DatabaseError as exc:
        logger.warning(
            "%s: check-in of %s failed (%s); its lease will expire", processor.name, record.pk, exc
        )
