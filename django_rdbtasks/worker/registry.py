"""The worker registry: one row per worker process, as it last reported itself."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction

from ..db.functions import DbNow
from ..retrying import Backoff, close_quietly

logger = logging.getLogger("django_rdbtasks.worker")


#: Said with the first failed heartbeat of an outage, once.
REGISTRY_ADVICE = (
    "tasks keep running and the worker reconnects by itself; if the server stays "
    "down, point this worker at one that is up (another node or the cluster's address)"
)


class Registry:
    def __init__(self, alias: str, name: str) -> None:
        self.alias = alias
        self.name = name
        #: Failed heartbeats in a row: only its ``loud`` rule is used (the
        #: keeper paces the heartbeats), so that a server gone for long is
        #: reported as every other retry loop reports it, not every heartbeat.
        self._failures = Backoff()

    def _rows(self) -> Any:
        from ..models import Worker as WorkerRow

        return WorkerRow.objects.using(self.alias)

    def register(self, **fields: Any) -> bool:
        rows = self._rows()
        # Rows of workers gone for a day are history nobody reads.
        rows.filter(last_heartbeat_at__lt=DbNow() - timedelta(days=1)).delete()
        fields.update(
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=DbNow(),
            last_heartbeat_at=DbNow(),
            stopped_at=None,
            running=0,
            done=0,
            failed=0,
        )
        # Update, else insert: no read-then-write transaction (which SQLite
        # cannot upgrade while another process writes).
        if not rows.filter(name=self.name).update(**fields):
            try:
                with transaction.atomic(using=self.alias):
                    rows.create(name=self.name, **fields)
            except IntegrityError:
                rows.filter(name=self.name).update(**fields)
        return True

    def alive(self, *, running: int, done: int, failed: int) -> None:
        try:
            self._rows().filter(name=self.name).update(
                last_heartbeat_at=DbNow(), running=running, done=done, failed=failed
            )
        except DatabaseError as exc:
            self._failures.next_delay()
            failures = self._failures.failures
            if failures == 1:
                logger.warning(
                    "could not update the worker registry (%s); %s", exc, REGISTRY_ADVICE
                )
            else:
                logger.log(
                    logging.WARNING if self._failures.loud else logging.DEBUG,
                    "could not update the worker registry (%s) [%d heartbeats in a row]",
                    exc,
                    failures,
                )
            # Reconnect at the next heartbeat: nothing else may (an idle
            # process renews no lease), and a closed connection stays closed.
            close_quietly(self.alias)
            return
        if self._failures.failures:
            logger.info(
                "worker registry updated again after %d failed heartbeats",
                self._failures.failures,
            )
            self._failures.reset()

    def deregister(self, *, done: int, failed: int) -> None:
        self._rows().filter(name=self.name).update(
            stopped_at=DbNow(), last_heartbeat_at=DbNow(), running=0, done=done, failed=failed
        )


# -- processes that ended without saying goodbye -------------------------------------------


def mark_gone(alias: str, pids: list[int]) -> int:
    """Mark stopped the registrations of this host's processes ``pids``, which have ended.

    For the supervisor, on behalf of children that could not do it themselves
    (killed, or gone at once on a second signal). Fenced so that it never
    touches a live registration: a row already stopped is left as it is, and
    a pid that belongs to a running process now (reused since) is skipped. The
    supervisor asks before it reaps its children, while their pids are held by
    zombies that no new process can take.
    """
    from ..models import Worker as WorkerRow

    host = socket.gethostname()
    names = [f"{host}:{pid}" for pid in pids if not _runs(pid)]
    if not names:
        return 0
    return (
        WorkerRow.objects.using(alias)
        .filter(name__in=names, stopped_at__isnull=True)
        .update(stopped_at=DbNow(), running=0)
    )


def _runs(pid: int) -> bool:
    """Whether a process that has not ended holds ``pid`` (a zombie has ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            # Field 3, the state, after the command name (which may hold spaces).
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # cannot tell: assume it runs, never overwrite a live row


# -- this host's workers, for a liveness probe ---------------------------------------------

#: Seconds a registration may seem older than its process: the two ages are
#: measured on different clocks (the database's, the kernel's).
AGE_SLACK = 5.0


@dataclass(frozen=True, slots=True)
class LocalWorker:
    name: str
    pid: int
    #: Seconds since it registered and since its last heartbeat, database clock.
    registered_for: float
    heartbeat_age: float


def local_workers(alias: str) -> list[LocalWorker]:
    """This host's worker processes that registered and have not said goodbye.

    Rows whose process is gone are left out: a crashed worker is the
    supervisor's to replace, and it registers again under its own pid. So is a
    row whose pid now belongs to a younger process (a restarted container
    numbers its processes the same way); see ``_is_running``.
    """
    from ..jobs import database_now
    from ..models import Worker as WorkerRow

    now = database_now(alias)
    rows = WorkerRow.objects.using(alias).filter(host=socket.gethostname(), stopped_at__isnull=True)
    found = []
    for name, pid, started_at, heartbeat_at in rows.values_list(
        "name", "pid", "started_at", "last_heartbeat_at"
    ):
        registered_for = (now - started_at).total_seconds()
        if _is_running(pid, registered_for):
            found.append(
                LocalWorker(name, pid, registered_for, (now - heartbeat_at).total_seconds())
            )
    return found


def _is_running(pid: int, registered_for: float) -> bool:
    """Whether ``pid`` is alive here and old enough to be the one that registered."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    age = _process_age(pid)
    return age is None or registered_for <= age + AGE_SLACK


def _process_age(pid: int) -> float | None:
    """Seconds since ``pid`` started, from /proc (Linux); None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except OSError:
        return None
    # Field 22, start time in clock ticks since boot; the command name (field 2,
    # in parentheses) may hold spaces, so count from the last ')'.
    started_ticks = int(stat.rsplit(")", 1)[1].split()[19])
    return uptime - started_ticks / os.sysconf("SC_CLK_TCK")
