"""What holds back vacuum in ``bench/sustained.py --pinned``: a snapshot the harness holds.

Issue 43: a long transaction anywhere on the server (a report, a ``pg_dump``,
a replica with ``hot_standby_feedback``) keeps every row version deleted after
its snapshot from being vacuumed, and a queue table whose every task leaves
dead versions behind then grows and slows for as long as it lasts.

The pin is one session that ``BEGIN ISOLATION LEVEL REPEATABLE READ``, takes
an xid (``txid_current()``) and its snapshot (a read of the task table, which
with inheritance reads the finished rows too), then stays *idle in
transaction* until released. ``readers`` more sessions each hold a REPEATABLE
READ snapshot of their own for the same span and scan the task table every
``read_every`` seconds, as an analytics report or a dump does: they keep the
same horizon and also cost the server what a scan of a bloated table costs.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from systems.rdbtasks import TABLE

from .pg import PgServer

SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ"
READ = f"SELECT count(*), max(enqueued_at) FROM {TABLE}"


@dataclass
class Pin:
    server: PgServer
    database: str
    readers: int = 0
    read_every: float = 5.0
    #: The pinning transaction's xid, once held.
    xid: int | None = None
    held_at: float | None = None
    released_at: float | None = None
    #: Scans the readers made, and how long they took in all (seconds).
    scans: int = 0
    scan_seconds: float = 0.0
    _holder: psycopg.Connection | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _errors: list[str] = field(default_factory=list)

    def hold(self) -> None:
        conn = self.server.connect(self.database)
        conn.execute(SNAPSHOT)
        row = conn.execute("SELECT txid_current()").fetchone()
        assert row is not None
        self.xid = int(row[0])
        conn.execute(READ).fetchone()  # the snapshot, as a report's first read takes it
        self._holder = conn
        self.held_at = time.time()
        self._stop.clear()
        ready = threading.Barrier(self.readers + 1)
        for k in range(self.readers):
            thread = threading.Thread(
                target=self._read, args=(ready,), name=f"pin-reader-{k}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        if self.readers:
            ready.wait(60)  # every reader's snapshot taken before the pin counts as held

    def _read(self, ready: threading.Barrier) -> None:
        try:
            with self.server.connect(self.database) as conn:
                conn.execute(SNAPSHOT)
                conn.execute(READ).fetchone()
                ready.wait(60)
                while not self._stop.wait(self.read_every):
                    began = time.perf_counter()
                    conn.execute(READ).fetchone()
                    with self._lock:
                        self.scans += 1
                        self.scan_seconds += time.perf_counter() - began
                conn.execute("ROLLBACK")
        except Exception as exc:  # reported with the run, which goes on
            self._errors.append(f"{type(exc).__name__}: {exc}")
            ready.abort()

    def release(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)
        self._threads.clear()
        if self._holder is not None:
            self._holder.execute("ROLLBACK")
            self._holder.close()
            self._holder = None
            self.released_at = time.time()

    @property
    def held(self) -> bool:
        return self._holder is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "readers": self.readers,
            "read_every_s": self.read_every,
            "xid": self.xid,
            "held_at": self.held_at,
            "released_at": self.released_at,
            "reader_scans": self.scans,
            "reader_scan_mean_s": self.scan_seconds / self.scans if self.scans else None,
            "errors": list(self._errors),
        }
