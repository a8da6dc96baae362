"""The two loops every long-lived part of the worker needs, written once.

- :func:`retry_database` runs an operation until it gets through a database
  outage: jittered exponential backoff, the broken connection closed so the
  next try reconnects, logged once and then every twentieth failure. A lost
  race (:func:`is_lost_race`: a deadlock, a serialization failure, a Galera
  certification conflict) is no outage: it is retried within milliseconds on
  the same connection, counted and logged at debug only. A refusal of the
  data (``database_errors.is_refusal``) is never the operation's to retry: the
  worker's writes of a task's data find and fail that task first
  (``worker/store.py``); one that still comes here is not any task's, and is
  logged as an error at each try.
- :class:`LeaseRenewer` renews a lease from a background thread every third of
  it until stopped, and says when the lease was lost.

Used by the worker's claim loop and lease keeper, the scheduler, the listener,
record check-out and leased locks.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, connections

from .database_errors import describe, is_lost_race, is_refusal

__all__ = [
    "Backoff",
    "LeaseRenewer",
    "close_quietly",
    "is_lost_race",
    "lost_races",
    "race_logger",
    "retry_database",
]

T = TypeVar("T")

logger = logging.getLogger("django_rdbtasks")
#: Lost races only, at debug: enable it to see them (``tests/test_galera.py`` does).
race_logger = logging.getLogger("django_rdbtasks.races")

FIRST_DELAY = 0.1
MAX_DELAY = 5.0
#: Retrying a lost race: a few milliseconds, so the winner's write (on Galera,
#: its write set, still being applied on this node) is visible by then.
RACE_FIRST_DELAY = 0.005
RACE_MAX_DELAY = 0.2
#: How often a wait between two tries asks ``give_up`` (a signal handler's
#: flag, which cannot set an Event): a signal ends the wait within this.
GIVE_UP_POLL = 0.1
#: Longest ``LeaseRenewer.stop`` waits for a renewal in flight (one blocked
#: on a server cut off silently would otherwise hold the caller for the
#: connection's TCP bounds); the thread ends on its own after it.
RENEWER_STOP_WITHIN = 1.0
#: Consecutive lost races after which one warning says something is wrong
#: (a hot row everybody writes), in case they never stop.
RACE_WARN_EVERY = 100


class RaceCounter:
    """How many lost races this process retried (all threads), for logs and tests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self) -> int:
        with self._lock:
            self.count += 1
            return self.count


lost_races = RaceCounter()


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

    @property
    def loud(self) -> bool:
        """Log the failure as a warning: the first of a run, then every twentieth."""
        return self.failures == 1 or self.failures % 20 == 0


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

    A lost race is retried after a few milliseconds on the same connection,
    without ``on_error``: the operation's transaction was rolled back whole
    (by ``transaction.atomic``, or by the server), nothing it believed it won
    was committed, and the connection is fine. The operation must therefore
    trust what it wrote only once its transaction committed, as every caller
    in the worker does (``ClaimStore.exchange`` returns after the COMMIT).
    """
    backoff = Backoff()
    races = Backoff(RACE_FIRST_DELAY, RACE_MAX_DELAY)
    while True:
        try:
            return operation()
        # A UnicodeError: a driver refusing a value before it sends anything.
        except (DatabaseError, UnicodeError) as exc:
            if is_lost_race(exc) and _can_retry_race(alias):
                delay = races.next_delay()
                _note_race(what, exc, delay, races.failures)
                if _wait(stop, delay, give_up):
                    return None
                continue
            races.reset()
            delay = backoff.next_delay()
            if is_refusal(exc):
                # Not an outage: it will not pass by itself. Said every time.
                log.error(
                    "the database refused a write during %s (%s); it will be refused "
                    "again: retrying in %.1fs",
                    what,
                    describe(exc)[:500],
                    delay,
                )
            else:
                level = logging.WARNING if backoff.loud else logging.DEBUG
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
        if _wait(stop, delay, give_up):
            return None


def _wait(stop: threading.Event, delay: float, give_up: Callable[[], bool]) -> bool:
    """Wait ``delay`` seconds between tries; True as soon as stopped or given up."""
    deadline = time.monotonic() + delay
    while not give_up():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if stop.wait(min(GIVE_UP_POLL, left)):
            return True
    return True


def _can_retry_race(alias: str | None) -> bool:
    """Not inside a caller's transaction: the server rolled all of it back, not just our part."""
    if alias is None:
        return True
    connection = connections[alias]
    if connection.in_atomic_block:
        return False
    try:
        connection.rollback()  # a no-op in autocommit; ends anything left open
    except DatabaseError:
        close_quietly(alias)
    return True


def _note_race(what: str, exc: BaseException, delay: float, in_a_row: int) -> None:
    total = lost_races.add()
    race_logger.debug(
        "lost a race during %s (%s); retrying in %.3fs [%d lost races so far]",
        what,
        exc,
        delay,
        total,
    )
    if in_a_row % RACE_WARN_EVERY == 0:
        logger.warning(
            "%s lost %d races in a row (%s): one row written by everybody?", what, in_a_row, exc
        )


class LeaseRenewer:
    """Calls ``renew`` every ``interval`` seconds on a daemon thread until stopped.

    ``renew`` returns False when the lease is no longer ours: then ``lost`` is
    set, ``on_lost`` is called and the thread ends. A database error is logged
    and retried sooner than the interval (jittered backoff from 0.1 s, never
    later than the interval): the lease is still ours until it runs out, and
    waiting a whole interval after each failure would let two failures in a
    row lose it. A lost race (the renewal met a conflicting write: on Galera,
    one committed on another node) is retried within milliseconds, logged at
    debug, on the same connection. ``stop`` waits for a renewal in flight for
    at most ``RENEWER_STOP_WITHIN``: one blocked on a server cut off silently
    ends on its own thread.
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

    def stop(self, within: float = RENEWER_STOP_WITHIN) -> bool:
        """Stop renewing; wait at most ``within`` for a renewal in flight. True if it ended."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(within)
        return not self._thread.is_alive()

    def _run(self) -> None:
        backoff = Backoff(cap=self.interval)
        races = Backoff(RACE_FIRST_DELAY, min(RACE_MAX_DELAY, self.interval))
        delay = self.interval
        try:
            while not self._stop.wait(delay):
                try:
                    renewed = self.renew()
                except DatabaseError as exc:
                    if is_lost_race(exc) and _can_retry_race(self.alias):
                        delay = races.next_delay()
                        _note_race(self._thread.name, exc, delay, races.failures)
                        continue
                    races.reset()
                    delay = min(self.interval, backoff.next_delay())
                    loud = backoff.loud
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
                if self._stop.is_set():
                    # Stopped while it renewed: the caller moved on (and may have
                    # released the lease itself), a late answer is no loss.
                    return
                if not renewed:
                    self.lost.set()
                    if self.on_lost is not None:
                        self.on_lost()
                    return
                backoff.reset()
                races.reset()
                delay = self.interval
        finally:
            connections.close_all()
