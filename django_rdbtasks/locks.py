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
from django.utils.crypto import get_random_string

from .db.functions import DbNow
from .models import Lock

logger = logging.getLogger("django_rdbtasks.locks")


class LockNotAcquired(Exception):
    """Someone else holds the lock."""


class LockLost(Exception):
    """The lease lapsed and another holder may have taken over."""


class LeasedLock:
    """A named lock held through a lease in the ``Lock`` table.

    ::

        with LeasedLock("hot-ranking", lease=30) as lock:
            while work_left():
                lock.check()            # raises LockLost once the lease is gone
                write_results(fencing_token=lock.token)

    Acquiring sets a lease from the database clock and increments ``token``,
    the fencing token: every takeover gets a larger one, so a store that keeps
    the largest token it has seen can refuse late writes from an old holder.
    While held, a thread renews the lease every third of it. A holder that dies
    stops renewing; after the lease anyone may take over.
    """

    def __init__(self, name: str, *, lease: float = 30.0, using: str | None = None) -> None:
        self.name = name
        self.lease = lease
        self.using = using or router.db_for_write(Lock)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{get_random_string(8)}"
        self.token: int | None = None
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _expiry(self) -> object:
        return DbNow() + timedelta(seconds=self.lease)

    def acquire(self, *, blocking: bool = False, timeout: float | None = None) -> bool:
        """Take the lock if free or lapsed; with ``blocking``, wait up to ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._try_acquire():
                self.lost.clear()
                return True
            if not blocking or (deadline is not None and time.monotonic() >= deadline):
                return False
            time.sleep(min(0.5, self.lease / 4))

    def _try_acquire(self) -> bool:
        locks = Lock.objects.using(self.using)
        free = Q(expires_at__isnull=True) | Q(expires_at__lte=DbNow()) | Q(holder="")
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
        self.token = (
            locks.filter(name=self.name, holder=self.holder).values_list("token", flat=True).first()
        )
        return self.token is not None

    def renew(self) -> bool:
        """Extend the lease; False (and ``lost`` set) if it is no longer ours."""
        renewed = (
            Lock.objects.using(self.using)
            .filter(name=self.name, holder=self.holder, token=self.token)
            .update(expires_at=self._expiry())
        )
        if not renewed:
            self.lost.set()
        return bool(renewed)

    def release(self) -> None:
        Lock.objects.using(self.using).filter(
            name=self.name, holder=self.holder, token=self.token
        ).update(holder="", expires_at=None)

    def check(self) -> None:
        if self.lost.is_set():
            raise LockLost(f"lock {self.name!r} (token {self.token}) was lost")

    def _renew_loop(self) -> None:
        try:
            while not self._stop.wait(self.lease / 3):
                try:
                    if not self.renew():
                        logger.warning("lock %s lost (token %s)", self.name, self.token)
                        return
                except DatabaseError as exc:
                    logger.warning("lock %s: renewal failed (%s); retrying", self.name, exc)
                    connections[self.using].close()
        finally:
            connections.close_all()

    def start_renewing(self) -> None:
        """Renew the lease from a background thread until ``stop_renewing``."""
        self._stop.clear()
        self._renewer = threading.Thread(
            target=self._renew_loop, name=f"rdbtasks-lock-{self.name}", daemon=True
        )
        self._renewer.start()

    def stop_renewing(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
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
