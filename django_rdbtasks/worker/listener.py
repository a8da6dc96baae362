"""LISTEN for enqueue notifications on PostgreSQL and wake idle claim loops."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from django.db import connections

from ..db import dialect_for
from ..db.postgresql.channels import NOTIFY_CHANNEL, SLOT_CHANNEL
from ..retrying import Backoff
from .lanes import Wake

logger = logging.getLogger("django_rdbtasks.worker")


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
        params = wrapper.get_connection_params()
        # The worker's keepalives: a server that vanished without a reset (a
        # failover, a partition) is noticed in seconds, not the OS's two hours.
        params.update(dialect_for(wrapper).connection_options(self.lease))
        raw = wrapper.get_new_connection(params)
        raw.autocommit = True
        raw.execute(f"LISTEN {NOTIFY_CHANNEL}")
        raw.execute(f"LISTEN {SLOT_CHANNEL}")
        return raw

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
            self.ready.set()
            # Anything enqueued while we were not listening is found by polling.
            self.wake.set()
            try:
                while not self.halt.is_set():
                    for notify in raw.notifies(timeout=0.5):
                        if notify.payload not in self.queues:
                            continue
                        if notify.channel == SLOT_CHANNEL:
                            self.wake.slot_freed()
                        else:
                            self.wake.set()
            except Exception as exc:
                if not self.halt.is_set():
                    logger.warning("LISTEN connection lost (%s); reconnecting", exc)
            finally:
                try:
                    raw.close()
                except Exception:
                    pass
