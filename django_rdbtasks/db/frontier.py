"""A lane's read frontier: where its next claim starts reading (PostgreSQL).

Why (issue 43; docs/design/vacuum-independent-claims.md): a claim that reads
the fresh READY rows and the expired leases from the head of their indexes
visits, under a snapshot someone holds open (a report, ``pg_dump``, a replica's
``hot_standby_feedback``), the dead entry of every task claimed and finished
since that snapshot began, and fetches its heap tuple: no scan may mark an
entry dead while a snapshot can still see its row. The read then grows with
the pin's length, and so does the pickup latency. A read that starts where the
lane's last read stopped visits only what was written since.

The frontier is, per queue and priority, the ``run_after`` from which the
lane reads fresh rows, and per queue the ``lease_expires_at`` from which it
reads expired leases. The round statement reads from there and says where the
next read may start (``RoundSQL.frontier_rows``): the first row from the start
it did not claim, read without a lock, or its clock when there is none
(optimistic claims take it from their own read of the pair, which locks
nothing; skip-locked ones, whose read skips locked rows, read it apart).

Why nothing READY is left behind the frontier:

- *Fresh rows* get ``run_after`` from the clock of the statement that made
  them READY (db/ready_arms.py), so never earlier than their transaction's
  start. A row that commits after a read whose frontier passed its
  ``run_after`` (a producer's transaction that was open during the read) is
  announced at its commit: every enqueue, dependant released and task given
  back notifies ``(queue, priority, its transaction's start)`` on
  ``READY_CHANNEL`` (postgresql/channels.py, ``notify_ready``), and the
  listener lowers each lane's frontier to it (``lower``) before the lane's next
  round reads. A row someone holds locked while READY is seen by the unlocked
  read and stops the frontier there.
- *Expired leases*: a lease is written as its statement's clock plus the lease,
  by a statement that ``statement_timeout = lease / 2`` ends first
  (postgresql/sessions.py), so one that commits after a read ends after that
  read's clock, which is where the frontier can be at most.
- Anything else that makes fresh rows or may have been missed calls for a
  full read, from the head, with each queue's priorities found again
  (``reread``): a notification on the old channel (a producer of an older
  release, the SQL function ``rdbtasks_enqueue_v1``, a requeue, a queue
  resumed), the listener's connection made again (what was sent meanwhile is
  lost), the lane's connection made again, and a round that failed. And once
  every ``FULL_READ_SECONDS`` whatever happened: the safety net, which also
  bounds what a mistake here could cost to that delay.

A frontier is used only by a lane of a worker that listens (a worker without
NOTIFY reads from the head, as before), on a clock that is not pinned (tests).
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

#: The longest a lane reads from its frontier before it reads from the head
#: again. Under a pinned snapshot a full read costs what every read cost
#: before the frontier (design study, section 1.3), once in this many seconds
#: a lane; and it is the most a row the frontier passed by a mistake waits.
FULL_READ_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class FrontierRead:
    """What one round reads from: the arrays of the bounded statement."""

    fresh_queues: list[str] = field(default_factory=list)
    fresh_priorities: list[int] = field(default_factory=list)
    fresh_from: list[dt.datetime] = field(default_factory=list)
    lease_queues: list[str] = field(default_factory=list)
    lease_from: list[dt.datetime] = field(default_factory=list)
    #: A full read: every queue's priorities found again, read from the head.
    discover: bool = False

    def parameters(self) -> dict[str, object]:
        return {
            "fresh_queues": self.fresh_queues,
            "fresh_priorities": self.fresh_priorities,
            "fresh_from": self.fresh_from,
            "lease_queues": self.lease_queues,
            "lease_from": self.lease_from,
            "discover": self.discover,
        }


class ReadFrontier:
    """One lane's frontier (see the module's docstring). The lane's round thread
    reads and advances it; the listener's thread lowers it or asks for a full read."""

    def __init__(
        self, full_every: float = FULL_READ_SECONDS, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.full_every = full_every
        self._clock = clock
        self._lock = threading.Lock()
        #: (queue, priority) -> the ``run_after`` the next read of fresh rows starts at.
        self.fresh: dict[tuple[str, int], dt.datetime] = {}
        #: queue -> the ``lease_expires_at`` the next read of expired leases starts at.
        self.leases: dict[str, dt.datetime] = {}
        #: Notified starts not yet taken by a round (the listener's).
        self._lowered: dict[tuple[str, int], dt.datetime] = {}
        self._full = True
        #: Whether the last ``take`` read from the head (burst mode ends on one).
        self.last_read_full = False
        #: When (``clock``) the next full read is due, staggered so that the
        #: lanes of a worker do not all read from the head in the same round.
        self._full_due = 0.0
        #: Whether notifications can reach it (the listener is connected).
        self._listening = False

    # -- the listener's thread ------------------------------------------------------------

    def lower(self, queue: str, priority: int, start: dt.datetime) -> None:
        """Rows of ``queue`` and ``priority`` committed by a transaction that began at ``start``."""
        key = (queue, priority)
        with self._lock:
            known = self._lowered.get(key)
            if known is None or start < known:
                self._lowered[key] = start

    def reread(self) -> None:
        """The next round reads from the head (rows may have been made that no
        notification of ``lower`` announced)."""
        with self._lock:
            self._full = True

    def listening(self, connected: bool) -> None:
        """The listener's connection is up (notifications arrive) or down (they are lost)."""
        with self._lock:
            self._listening = connected
            self._full = True

    # -- the round thread -----------------------------------------------------------------

    def take(self, queues: Sequence[str]) -> FrontierRead:
        """Where this round reads from. The notified starts are folded in now: a
        round that does not get as far as ``advance`` leaves them in force."""
        now = self._clock()
        with self._lock:
            for key, start in self._lowered.items():
                known = self.fresh.get(key)
                if known is None or start < known:
                    self.fresh[key] = start
            self._lowered.clear()
            self.last_read_full = self._full or not self._listening or now >= self._full_due
            if self.last_read_full:
                self._full = False
                self._full_due = now + self.full_every * random.uniform(0.75, 1.0)
                return FrontierRead(discover=True)
            wanted = set(queues)
            fresh = [(key, start) for key, start in self.fresh.items() if key[0] in wanted]
            leases = [(queue, start) for queue, start in self.leases.items() if queue in wanted]
        return FrontierRead(
            fresh_queues=[queue for (queue, _), _ in fresh],
            fresh_priorities=[priority for (_, priority), _ in fresh],
            fresh_from=[start for _, start in fresh],
            lease_queues=[queue for queue, _ in leases],
            lease_from=[start for _, start in leases],
        )

    def advance(
        self,
        read: FrontierRead,
        fresh: Iterable[tuple[str, int, dt.datetime]],
        leases: Iterable[tuple[str, dt.datetime]],
    ) -> None:
        """Where the round's statement says the next read may start.

        After a full read the pairs it did not return have no fresh row left
        (a late one is notified again). Starts notified meanwhile are kept for
        the next ``take``.
        """
        with self._lock:
            if read.discover:
                self.fresh.clear()
            for queue, priority, start in fresh:
                self.fresh[(queue, priority)] = start
            for queue, start in leases:
                self.leases[queue] = start

    def forget(self) -> None:
        """Everything: the lane's connection was made again, or a round failed."""
        with self._lock:
            self.fresh.clear()
            self.leases.clear()
            self._full = True
