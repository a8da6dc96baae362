"""The two loops every long-lived part of the worker needs, written once.

- :func:`retry_database` runs an operation until it gets through a database
  outage: jittered exponential backoff, the broken connection closed so the
  next try reconnects, logged once and then every twentieth failure.
- :class:`LeaseRenewer` renews a lease from a background thread every third of
  it until stopped, and says when the lease was lost.

Used by the worker's claim loop and lease keeper, the scheduler, the listener,
record check-out and leased locks.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, connections

T = TypeVar("T")

logger = logging.getLogger("django_rdbtasks")

FIRST_DELAY = 0.1
MAX_DELAY = 5.0


class Backoff:
    """Jittered exponential delays: processes that failed together must not retry together."""

    def __init__(self, first: float = FIRST_DELAY, cap: float = MAX_DELAY) -> None:
        self.first = first
        self.cap = cap
        self.failures = 0

    def next_delay(self) -> float:
        base = min(self.cap, self.first * 2**self.failures)
        self.failures += 1
        return base * random.uniform(0.5, 1.5)

    def reset(self) -> None:
        self.failures = 0


def close_quietly(alias: str) -> None:
    """Close this thread's connection to ``alias``; the next query reconnects."""
    try:
        connections[alias].close()
    except DatabaseError:
        pass


def retry_database(
    operation: Callable[[], T],
    what: str,
    *,
    alias: str | None,
    stop: threading.Event,
    give_up: Callable[[], bool] = lambda: False,
    log: logging.Logger = logger,
    on_error: Callable[[], None] | None = None,
) -> T | None:
    """Run ``operation``, retrying through database errors; None if stopped first.

    ``stop`` ends the waiting between tries at once (and returns None);
    ``give_up`` is asked after each failure. ``alias`` names the Django
    connection to close after a failure (None when the operation owns its
    connection; then ``on_error`` resets it).
    """
    backoff = Backoff()
    while True:
        try:
            return operation()
        except DatabaseError as exc:
            delay = backoff.next_delay()
            loud = backoff.failures == 1 or backoff.failures % 20 == 0
            level = logging.WARNING if loud else logging.DEBUG
            log.log(
                level,
                "database error during %s (%s: %s); retrying in %.1fs",
                what,
                type(exc).__name__,
                exc,
                delay,
            )
            if alias is not None:
                close_quietly(alias)
            if on_error is not None:
                on_error()
        if give_up() or stop.wait(delay):
            return None


class LeaseRenewer:
    """Calls ``renew`` every ``interval`` seconds on a daemon thread until stopped.

    ``renew`` returns False when the lease is no longer ours: then ``lost`` is
    set, ``on_lost`` is called and the thread ends. A database error is logged
    and retried sooner than the interval (jittered backoff from 0.1 s, never
    later than the interval): the lease is still ours until it runs out, and
    waiting a whole interval after each failure would let two failures in a
    row lose it.
    """

    def __init__(
        self,
        renew: Callable[[], bool],
        *,
        interval: float,
        name: str,
        alias: str | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.renew = renew
        self.interval = interval
        self.alias = alias
        self.on_lost = on_lost
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> LeaseRenewer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        backoff = Backoff(cap=self.interval)
        delay = self.interval
        try:
            while not self._stop.wait(delay):
                try:
                    renewed = self.renew()
                except DatabaseError as exc:
                    delay = min(self.interval, backoff.next_delay())
                    loud = backoff.failures == 1 or backoff.failures % 20 == 0
                    logger.log(
                        logging.WARNING if loud else logging.DEBUG,
                        "%s: renewal failed (%s); retrying in %.1fs",
                        self._thread.name,
                        exc,
                        delay,
                    )
                    if self.alias is not None:
                        close_quietly(self.alias)
                    continue
                if not renewed:
                    self.lost.set()
                    if self.on_lost is not None:
                        self.on_lost()
                    return
                backoff.reset()
                delay = self.interval
        finally:
            connections.close_all()
