"""Leased locks: one holder cluster-wide, renewed while held, taken over when it lapses."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta
from types import TracebackType

from django.db import DatabaseError, IntegrityError, connections, router, transaction
from django.db.models import F, Q
from django.db.models.expressions import CombinedExpression
from django.utils.crypto import get_random_string

from .db.functions import DbNow
from .models import Lock
from .retrying import LeaseRenewer, is_lost_race

logger = logging.getLogger("django_rdbtasks.locks")


class LockNotAcquired(Exception):
    """Raised by ``with LeasedLock(...)`` when someone else holds the lock.

    The ``with`` form does not wait; to wait for the lock, call
    ``acquire(blocking=True, timeout=...)``, which returns False instead of raising.
    """


class LockLost(Exception):
    """Raised by ``check()``: the lease may have lapsed, another holder may have taken over."""


class LeasedLock:
    """A named lock held through a lease in the ``Lock`` table.

    ::

        with LeasedLock("hot-ranking", lease=30) as lock:   # LockNotAcquired if held
            while work_left():
                lock.check()            # LockLost as soon as the lease can have run out
                write_results(fencing_token=lock.token)

    Acquiring sets a lease from the database clock and increments ``token``,
    the fencing token: every takeover gets a larger one, so a store that keeps
    the largest token it has seen can refuse late writes from an old holder.
    While held, a thread renews the lease every third of it. A holder that dies
    stops renewing; after the lease anyone may take over.

    Without ``with``: ``acquire()`` (False if held elsewhere; ``blocking=True``
    waits, up to ``timeout`` seconds if given), ``start_renewing()``,
    ``stop_renewing()`` and ``release()``.
    """

    def __init__(self, name: str, *, lease: float = 30.0, using: str | None = None) -> None:
        self.name = name
        self.lease = lease
        self.using = using or router.db_for_write(Lock)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{get_random_string(8)}"
        self.token: int | None = None
        #: Set once a renewal found the lock taken over (or released).
        self.lost = threading.Event()
        self._renewer: LeaseRenewer | None = None
        # Monotonic time before which the lease is certainly ours: ``lease``
        # seconds after the last successful acquire or renew was *sent* (the
        # database set the expiry from its clock later than that, never earlier).
        self._valid_until: float | None = None
        self._valid_until_lock = threading.Lock()

    def _expiry(self) -> CombinedExpression:
        return DbNow() + timedelta(seconds=self.lease)

    def _extend(self, sent: float) -> None:
        with self._valid_until_lock:
            if self._valid_until is None or sent + self.lease > self._valid_until:
                self._valid_until = sent + self.lease

    def acquire(self, *, blocking: bool = False, timeout: float | None = None) -> bool:
        """Take the lock if it is free or its lease has lapsed; True if taken.

        By default it does not wait: False if someone else holds it. With
        ``blocking=True`` it tries again (twice a second at most, and at least
        every quarter of the lease) until it gets the lock, or for at most
        ``timeout`` seconds (None: no limit) and then returns False. Acquiring
        does not start renewal: use ``with``, or call ``start_renewing()``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            sent = time.monotonic()
            if self._try_acquire():
                self.lost.clear()
                with self._valid_until_lock:
                    self._valid_until = sent + self.lease
                return True
            if not blocking:
                return False
            pause = min(0.5, self.lease / 4)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                pause = min(pause, left)
            time.sleep(pause)

    def _try_acquire(self) -> bool:
        locks = Lock.objects.using(self.using)
        free = Q(expires_at__isnull=True) | Q(expires_at__lte=DbNow()) | Q(holder="")
        try:
            taken = locks.filter(free, name=self.name).update(
                holder=self.holder,
                token=F("token") + 1,
                expires_at=self._expiry(),
                acquired_at=DbNow(),
            )
            if not taken:
                try:
                    with transaction.atomic(using=self.using):
                        locks.create(
                            name=self.name,
                            holder=self.holder,
                            token=1,
                            expires_at=self._expiry(),
                            acquired_at=DbNow(),
                        )
                except IntegrityError:
                    return False
        except DatabaseError as exc:
            # Galera: another node took (or created) the lock at the same
            # moment and won certification; it is held, as after a lost
            # UPDATE. Not inside a caller's transaction: the server rolled
            # all of that back, which the caller must hear about.
            if is_lost_race(exc) and not connections[self.using].in_atomic_block:
                return False
            raise
        self.token = (
            locks.filter(name=self.name, holder=self.holder).values_list("token", flat=True).first()
        )
        return self.token is not None

    def renew(self) -> bool:
        """Extend the lease; False (and ``lost`` set) if it is no longer ours."""
        if self.token is None:  # never acquired: nothing to renew
            self.lost.set()
            return False
        sent = time.monotonic()
        renewed = (
            Lock.objects.using(self.using)
            .filter(name=self.name, holder=self.holder, token=self.token)
            .update(expires_at=self._expiry())
        )
        if renewed:
            self._extend(sent)
        else:
            self.lost.set()
        return bool(renewed)

    def release(self) -> None:
        """Give the lock up at once (a no-op if it was taken over meanwhile)."""
        with self._valid_until_lock:
            self._valid_until = None
        if self.token is None:
            return
        Lock.objects.using(self.using).filter(
            name=self.name, holder=self.holder, token=self.token
        ).update(holder="", expires_at=None)

    def check(self) -> None:
        """Raise ``LockLost`` unless the lease is certainly still ours.

        That is: acquired, not released, not found taken over by a renewal, and
        less than ``lease`` seconds since the last successful acquire or renewal
        was sent (measured on this process's monotonic clock). So it raises as
        soon as the lease can have expired, whether or not anyone took over,
        without waiting for the renewal thread to notice.
        """
        if self.lost.is_set():
            raise LockLost(f"lock {self.name!r} (token {self.token}) was taken over or released")
        valid_until = self._valid_until
        if valid_until is None:
            raise LockLost(f"lock {self.name!r} is not held")
        if time.monotonic() >= valid_until:
            raise LockLost(
                f"lock {self.name!r} (token {self.token}) was not renewed for "
                f"{self.lease:g}s: its lease may have run out"
            )

    def _on_lost(self) -> None:
        logger.warning("lock %s lost (token %s)", self.name, self.token)

    def start_renewing(self) -> None:
        """Renew the lease from a background thread until ``stop_renewing``."""
        self.stop_renewing()
        self._renewer = LeaseRenewer(
            self.renew,
            interval=self.lease / 3,
            name=f"rdbtasks-lock-{self.name}",
            alias=self.using,
            on_lost=self._on_lost,
        ).start()

    def stop_renewing(self) -> None:
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None

    def __enter__(self) -> LeasedLock:
        if not self.acquire():
            raise LockNotAcquired(f"lock {self.name!r} is held by someone else")
        self.start_renewing()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_renewing()
        self.release()
