"""What a phase cost the PostgreSQL server: the CPU of all its processes, and its WAL.

Read from ``/proc``: every child of the postmaster (backends, autovacuum,
the WAL writer, the checkpointer...) while it lives, and the postmaster's
``cutime``/``cstime`` once it has been reaped, so that a backend that came and
went within the phase counts in full. The harness's own backends are left
out. It needs the harness on the server's host and a cluster that nothing
else uses (bench/README.md: a cluster of your own).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from .steady_sample import PROC, TICKS, proc_stat


@dataclass(frozen=True)
class Reading:
    cpu_seconds: float
    wal_lsn: str
    #: Full-page images written since the statistics were reset (``pg_stat_wal``):
    #: a page's first change after a checkpoint writes the whole page.
    wal_fpi: int


class ServerMeter:
    def __init__(self, conns: Sequence[psycopg.Connection]) -> None:
        """``conns``: the harness's connections, the first used to read the WAL position."""
        self.conns = list(conns)
        self.own = {conn.info.backend_pid for conn in self.conns}
        self.databases = [conn.info.dbname for conn in self.conns]
        #: The most client sessions seen in other databases at a reading.
        self.strangers = 0
        fields = proc_stat(next(iter(self.own)))
        if fields is None:
            raise RuntimeError("the server's processes are not in /proc: run on its host")
        self.postmaster = int(fields[1])  # field 4: the parent of a backend
        #: The processes that live as long as the server (the WAL writer, the
        #: checkpointer...) and the harness's own backends: the others are a phase's.
        self.lasting = self._children()

    def read(self) -> Reading:
        row = (
            self.conns[0]
            .execute(
                "SELECT pg_current_wal_lsn()::text, count(*) FILTER (WHERE backend_type ="
                " 'client backend' AND datname <> ALL(%s)), (SELECT wal_fpi FROM pg_stat_wal)"
                " FROM pg_stat_activity",
                (self.databases,),
            )
            .fetchone()
        )
        assert row is not None
        # Someone else's sessions: their work would be in the figures.
        self.strangers = max(self.strangers, int(row[1]))
        return Reading(self._cpu(), row[0], int(row[2]))

    def since(self, before: Reading) -> tuple[float, int, int]:
        """CPU seconds, WAL bytes and full-page images since ``before`` (the image
        count is the server's statistics, which lag: read after ``wait_idle``,
        once the phase's backends have exited and reported)."""
        after = self.read()
        row = (
            self.conns[0]
            .execute(
                "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint",
                (after.wal_lsn, before.wal_lsn),
            )
            .fetchone()
        )
        assert row is not None
        return (
            after.cpu_seconds - before.cpu_seconds,
            int(row[0]),
            after.wal_fpi - before.wal_fpi,
        )

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until the phase's backends have exited and been reaped.

        A backend's CPU is in the postmaster's ``cutime`` only once reaped, and
        on a busy machine a process that has just exited was seen in neither
        place now and then; so this also waits for ``cutime`` to stay put for
        a tenth of a second.
        """
        deadline = time.monotonic() + timeout
        reaped = self._reaped()
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self._reaped()
            if now == reaped and not self._children() - self.lasting:
                return
            reaped = now

    def _children(self) -> set[int]:
        pids = set()
        for entry in PROC.iterdir():
            if entry.name.isdigit():
                fields = proc_stat(int(entry.name))
                if fields is not None and int(fields[1]) == self.postmaster:
                    pids.add(int(entry.name))
        return pids

    def _reaped(self) -> int:
        """Clock ticks of the postmaster's reaped children (cutime + cstime)."""
        fields = proc_stat(self.postmaster)
        if fields is None:
            raise RuntimeError("the postmaster is gone")
        return int(fields[13]) + int(fields[14])

    def _cpu(self) -> float:
        ticks = self._reaped()
        for entry in PROC.iterdir():
            if not entry.name.isdigit() or int(entry.name) in self.own:
                continue
            child = proc_stat(int(entry.name))
            if child is not None and int(child[1]) == self.postmaster:
                ticks += int(child[11]) + int(child[12])  # utime, stime
        return ticks / TICKS
