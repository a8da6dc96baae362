"""LISTEN for enqueue notifications on PostgreSQL and wake idle claim loops."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Iterable
from typing import Any

from django.db import connections

from ..db.postgresql.channels import NOTIFY_CHANNEL, READY_CHANNEL, SLOT_CHANNEL
from ..retrying import Backoff
from .connection import own_session_options
from .lanes import Wake

logger = logging.getLogger("django_rdbtasks.worker")

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def parse_ready(payload: str) -> tuple[str, int, dt.datetime] | None:
    """``READY_CHANNEL``'s payload (postgresql/channels.py) as (queue, priority,
    start); None if it is not one."""
    parts = payload.split("|", 2)
    if len(parts) != 3:
        return None
    try:
        priority, micros = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return parts[2], priority, _EPOCH + dt.timedelta(microseconds=micros)


class Listener(threading.Thread):
    """Sets ``wake`` when a task is enqueued on one of ``queues``; and when a limit's
    slot comes free for a task of one of them (postgresql/limited.py), wakes one round
    thread waiting for a slot (``Wake.slot_freed``).

    Runs on its own connection: LISTEN needs one that is never inside a
    transaction. If it breaks, the claim loops still poll, so nothing is lost
    but latency; the listener reconnects with backoff.
    """

    def __init__(
        self,
        database: str,
        queues: Iterable[str],
        wake: Wake,
        halt: threading.Event,
        *,
        lease: float = 30.0,
    ) -> None:
        super().__init__(name="rdbtasks-listener", daemon=True)
        self.database = database
        self.lease = lease
        self.queues = set(queues)
        self.wake = wake
        self.halt = halt
        self.ready = threading.Event()

    def _connect(self) -> Any:
        wrapper = connections[self.database]
        # The worker's keepalives: a server that vanished without a reset (a
        # failover, a partition) is noticed in seconds, not the OS's two hours.
        params = own_session_options(wrapper, self.lease, wrapper.get_connection_params())
        raw = wrapper.get_new_connection(params)
        raw.autocommit = True
        raw.execute(f"LISTEN {NOTIFY_CHANNEL}")
        raw.execute(f"LISTEN {READY_CHANNEL}")
        raw.execute(f"LISTEN {SLOT_CHANNEL}")
        return raw

    def received(self, channel: str, payload: str) -> None:
        """One notification: wake the round threads it concerns."""
        if channel == READY_CHANNEL:
            ready = parse_ready(payload)
            if ready is None or ready[0] not in self.queues:
                return
            # Lowered before the wake-up: the round it starts reads from there.
            self.wake.lower(*ready)
            self.wake.set()
        elif payload not in self.queues:
            return
        elif channel == SLOT_CHANNEL:
            self.wake.slot_freed()
        else:
            self.wake.reread()
            self.wake.set()

    def run(self) -> None:
        backoff = Backoff()
        while not self.halt.is_set():
            try:
                raw = self._connect()
            except Exception as exc:
                logger.warning("LISTEN connection failed (%s); polling until it is back", exc)
                self.halt.wait(backoff.next_delay())
                continue
            backoff.reset()
            # Anything enqueued while we were not listening is found by a
            # read from the head (db/frontier.py), at once.
            self.wake.listening(True)
            self.wake.set()
            self.ready.set()
            try:
                while not self.halt.is_set():
                    for notify in raw.notifies(timeout=0.5):
                        self.received(notify.channel, notify.payload)
            except Exception as exc:
                if not self.halt.is_set():
                    logger.warning("LISTEN connection lost (%s); reconnecting", exc)
            finally:
                self.wake.listening(False)
                try:
                    raw.close()
                except Exception:
                    pass
