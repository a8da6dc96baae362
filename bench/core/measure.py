"""The measurements, the same for every system.

Every timed phase starts from emptied job tables, fresh planner statistics
and a checkpoint (see ``pg.settle``), so that one system does not inherit
another's (or its own previous run's) state.
"""

from __future__ import annotations

import resource
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from systems.base import System

from . import counters
from .pg import CREATE_STARTED_TABLE, scalar, settle, truncate
from .procs import WorkerGroup

#: How often the harness counts unfinished tasks while waiting for probes.
POLL_INTERVAL = 0.05
#: A drain's count of unfinished tasks costs a few ms of database CPU (a scan
#: of the job table, for the peers), taken from the systems measured; so the
#: harness polls seldom while many tasks are left and often near the end,
#: where the interval is the error in the drain's time.
DRAIN_POLL_MAX = 0.25
DRAIN_POLL_MIN = 0.01
#: While more tasks than this are left, a poll counts only this many (of each
#: source): a count of a whole queue mid-drain read 100,000 index entries and
#: their heap rows (over 100 ms a poll on two cores, taken from the workers'
#: CPU). Near the end, where the interval matters, the count is exact.
DRAIN_POLL_CAP = 2000
#: While the count is capped, a whole count this often shows progress (a stall).
DRAIN_FULL_COUNT_EVERY = 5.0
#: A drain in which no task finishes for this long is broken (workers crashing and being
#: restarted, say): the slowest system finishes a no-op task every few ms.
DRAIN_STALL = 30.0
#: After its warm-up task, how long the latency worker is left alone, so that
#: it is idle (asleep, or waiting on LISTEN) when the probes arrive.
IDLE_SETTLE = 1.5


@dataclass(frozen=True)
class DrainRun:
    tasks: int
    workers: int
    seconds: float  # from starting the worker processes to the last task finished
    first_done_seconds: float  # until the first task was seen finished: start-up cost
    #: User + system CPU of the worker processes and everything they forked, start-up
    #: included: less moved by a busy machine than the rate, which waits on the CPU.
    worker_cpu_seconds: float = 0.0
    #: Busy CPU time of the whole machine over ``seconds`` (all CPUs: the PostgreSQL
    #: server's included, and anything else running); None without /proc/stat.
    machine_cpu_seconds: float | None = None
    #: CPU time of the PostgreSQL server's processes over ``seconds``; None where they
    #: are not visible (a server on another machine).
    server_cpu_seconds: float | None = None
    #: WAL the server wrote from the start to the workers' exit (the whole server's).
    wal_bytes: int | None = None
    #: Transactions committed in the system's database (read-only ones included),
    #: less the harness's own polls.
    transactions: int | None = None
    #: Transactions committed in other databases meanwhile: if any, ``wal_bytes`` may
    #: include someone else's writes.
    other_transactions: int | None = None

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds

    def as_dict(self) -> dict[str, Any]:
        def per_task(value: float | None, scale: float = 1.0) -> float | None:
            return None if value is None else value / self.tasks * scale

        return {
            **asdict(self),
            "tasks_per_second": self.rate,
            "worker_cpu_us_per_task": self.worker_cpu_seconds / self.tasks * 1e6,
            "machine_cpu_us_per_task": per_task(self.machine_cpu_seconds, 1e6),
            "server_cpu_us_per_task": per_task(self.server_cpu_seconds, 1e6),
            "wal_bytes_per_task": per_task(self.wal_bytes),
            "transactions_per_task": per_task(self.transactions),
        }


@dataclass(frozen=True)
class EnqueueRun:
    single_count: int
    single_seconds: float
    bulk_count: int
    bulk_seconds: float
    chunk: int
    #: The ordinary one-task call, ``chunk`` calls inside each transaction.
    transaction_count: int = 0
    transaction_seconds: float = 0.0
    #: The enqueueing process's own CPU (driver, framework, client library).
    single_cpu_seconds: float = 0.0
    transaction_cpu_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "single_client_cpu_us": self.single_cpu_seconds / self.single_count * 1e6,
            "transaction_client_cpu_us": (
                self.transaction_cpu_seconds / self.transaction_count * 1e6
                if self.transaction_count
                else None
            ),
            "single_per_second": self.single_count / self.single_seconds,
            "transaction_per_second": (
                self.transaction_count / self.transaction_seconds
                if self.transaction_seconds
                else None
            ),
            "bulk_per_second": self.bulk_count / self.bulk_seconds,
        }


@dataclass(frozen=True)
class LatencyRun:
    delays_ms: list[float]

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": len(self.delays_ms),
            "p50_ms": percentile(self.delays_ms, 50),
            "p99_ms": percentile(self.delays_ms, 99),
            "mean_ms": statistics.fmean(self.delays_ms),
            "max_ms": max(self.delays_ms),
        }


@dataclass(frozen=True)
class MixedRun:
    """Start delays (start minus the time just before the enqueue call) of a mixed load."""

    delays_ms: list[float]  # every task's, in enqueue order
    long_indexes: list[int]  # which of them slept
    tasks: int
    workers: int
    enqueue_seconds: float  # how long the enqueuing took (planned: tasks / rate)
    long_seconds: float

    @property
    def short_delays_ms(self) -> list[float]:
        longs = set(self.long_indexes)
        return [delay for i, delay in enumerate(self.delays_ms) if i not in longs]

    @property
    def long_delays_ms(self) -> list[float]:
        return [self.delays_ms[i] for i in self.long_indexes]

    def as_dict(self) -> dict[str, Any]:
        short = self.short_delays_ms
        long = self.long_delays_ms
        threshold = self.long_seconds * 500
        return {
            "tasks": self.tasks,
            "workers": self.workers,
            "short_count": len(short),
            "long_count": len(long),
            "enqueue_seconds": self.enqueue_seconds,
            "short_p50_ms": percentile(short, 50),
            "short_p90_ms": percentile(short, 90),
            "short_p99_ms": percentile(short, 99),
            "short_max_ms": max(short),
            "short_mean_ms": statistics.fmean(short),
            # Short tasks that waited more than half a long task's time: most likely behind one.
            "short_over_half_long": sum(1 for delay in short if delay > threshold),
            "half_long_ms": threshold,
            "long_p50_ms": percentile(long, 50) if long else None,
            "long_max_ms": max(long) if long else None,
            # Every task's delay in enqueue order (for plots), and which of them were long.
            "delays_ms": [round(delay, 1) for delay in self.delays_ms],
            "long_indexes": self.long_indexes,
        }


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (as numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# -- shared steps -------------------------------------------------------------------------


def reset(system: System, conn: psycopg.Connection) -> None:
    conn.execute(CREATE_STARTED_TABLE)
    truncate(conn, [*system.job_tables, "bench_started"])


def enqueue_bulk(system: System, tasks: int, chunk: int) -> float:
    result = system.drive("enqueue", "--mode", "bulk", "--count", str(tasks), "--chunk", str(chunk))
    return float(result["seconds"])


def time_drain(
    system: System, conn: psycopg.Connection, tasks: int, workers: int, log: Path
) -> DrainRun:
    """Start the workers and time them until no task of the ``tasks`` queued is left.

    Besides the time, what the drain cost: the workers' CPU, the machine's CPU over
    the same time, and the WAL and transactions until the workers' sessions ended
    (see ``counters``).
    """
    left = scalar(conn, system.unfinished_sql)
    if left != tasks:
        raise RuntimeError(f"{system.key}: {left} tasks queued before the drain, expected {tasks}")
    timeout = 60 + tasks / 20  # far beyond the slowest peer's rate
    first_done: float | None = None
    harness_pid = conn.info.backend_pid
    with system.context.server.connect("postgres") as stats:
        counters.flush_own_statistics(conn)
        server_before = counters.read_server(stats, system.database)
        # The harness forks nothing else meanwhile: what its reaped children used is the
        # workers'.
        cpu_before = _children_cpu()
        machine_before = counters.machine_busy_seconds()
        server_cpu_before = counters.server_busy_seconds(harness_pid)
        # The harness's polls are not the drain's: its session's CPU is taken off.
        polls_cpu_before = counters.session_busy_seconds(harness_pid)
        start = time.perf_counter()
        last_left, last_progress = left, start
        polls = 0  # the harness's own transactions in the system's database
        machine_after: float | None = None
        server_cpu_after: float | None = None
        polls_cpu_after: float | None = None
        with WorkerGroup(
            system.drain_commands(workers), cwd=system.project_dir, env=system.env(), log=log
        ) as group:
            capped_sql = system.unfinished_capped_sql(DRAIN_POLL_CAP)
            last_full_count = start
            while True:
                now = time.perf_counter()
                # Counted whole until the first task finished (the start-up cost)
                # and now and then for progress; otherwise at most the cap.
                whole = first_done is None or now - last_full_count >= DRAIN_FULL_COUNT_EVERY
                left = scalar(conn, system.unfinished_sql if whole else capped_sql)
                polls += 1
                elapsed = time.perf_counter() - start
                if whole:
                    last_full_count = now
                elif left >= DRAIN_POLL_CAP:
                    left = last_left  # many: the last whole count stands
                if first_done is None and left < tasks:
                    first_done = elapsed
                if left == 0:
                    machine_after = counters.machine_busy_seconds()
                    server_cpu_after = counters.server_busy_seconds(harness_pid)
                    polls_cpu_after = counters.session_busy_seconds(harness_pid)
                    break
                if left < last_left:
                    last_left, last_progress = left, time.perf_counter()
                elif time.perf_counter() - last_progress > DRAIN_STALL:
                    raise RuntimeError(
                        f"{system.key}: no task finished for {DRAIN_STALL:g} s, {left} left;"
                        f" see {log}"
                    )
                if not group.running():
                    left = scalar(conn, system.unfinished_sql)
                    polls += 1
                    if left > 0:
                        raise RuntimeError(
                            f"{system.key}: workers exited with {left} tasks left; see {log}"
                        )
                if elapsed > timeout:
                    raise RuntimeError(
                        f"{system.key}: drain timed out with {left} tasks left; see {log}"
                    )
                time.sleep(drain_poll_interval(tasks, left, elapsed))
            # Burst-mode workers exit by themselves: let them, rather than signal them
            # mid-exit.
            group.wait_exit(10.0)
        cpu = _children_cpu() - cpu_before
        counters.wait_sessions_gone(stats, system.database, harness_pid)
        counters.flush_own_statistics(conn)
        server_after = counters.read_server(stats, system.database)
        wal = counters.wal_bytes(stats, server_before.wal_lsn, server_after.wal_lsn)
    failed = scalar(conn, system.failed_sql)
    if failed:
        # A no-op task that fails is a broken set-up, and a rate that counts failures is no rate.
        raise RuntimeError(
            f"{system.key}: {failed} of {tasks} no-op tasks failed; see {log} and the table"
        )
    return DrainRun(
        tasks,
        workers,
        elapsed,
        first_done if first_done is not None else elapsed,
        cpu,
        machine_cpu_seconds=(
            None
            if machine_before is None or machine_after is None
            else machine_after - machine_before
        ),
        server_cpu_seconds=(
            None
            if None in (server_cpu_before, server_cpu_after, polls_cpu_before, polls_cpu_after)
            else (server_cpu_after - server_cpu_before) - (polls_cpu_after - polls_cpu_before)
        ),
        wal_bytes=wal,
        # Less the harness's polls and its last statistics flush.
        transactions=server_after.transactions - server_before.transactions - polls - 1,
        other_transactions=server_after.other_transactions - server_before.other_transactions,
    )


def _children_cpu() -> float:
    """CPU seconds of this process's children that have exited and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def drain_poll_interval(tasks: int, left: int, elapsed: float) -> float:
    """A quarter of the time the drain looks to need still, within the bounds above."""
    done = tasks - left
    if done <= 0:
        return POLL_INTERVAL
    expected_left = left * elapsed / done
    return min(DRAIN_POLL_MAX, max(DRAIN_POLL_MIN, expected_left / 4))


# -- the measurements ---------------------------------------------------------------------


def measure_drain(
    system: System, conn: psycopg.Connection, *, tasks: int, workers: int, chunk: int, log: Path
) -> DrainRun:
    reset(system, conn)
    enqueue_bulk(system, tasks, chunk)  # not timed here; see time_bulk_enqueues
    settle(conn, system.job_tables)
    return time_drain(system, conn, tasks, workers, log)


def time_single_enqueues(
    system: System, conn: psycopg.Connection, count: int
) -> tuple[float, float]:
    """Seconds, and the driver's CPU seconds, to enqueue ``count`` tasks one per transaction."""
    reset(system, conn)
    settle(conn, [])
    result = system.drive("enqueue", "--mode", "single", "--count", str(count))
    reset(system, conn)
    return float(result["seconds"]), float(result["cpu_seconds"])


def time_transaction_enqueues(
    system: System, conn: psycopg.Connection, count: int, chunk: int
) -> tuple[float, float]:
    """Seconds and driver CPU seconds for ``count`` ordinary calls, ``chunk`` a transaction."""
    reset(system, conn)
    settle(conn, [])
    result = system.drive(
        "enqueue", "--mode", "transaction", "--count", str(count), "--chunk", str(chunk)
    )
    reset(system, conn)
    return float(result["seconds"]), float(result["cpu_seconds"])


def time_bulk_enqueues(system: System, conn: psycopg.Connection, count: int, chunk: int) -> float:
    """Seconds to enqueue ``count`` tasks in bulk calls of ``chunk``, from an empty table."""
    reset(system, conn)
    settle(conn, [])
    seconds = enqueue_bulk(system, count, chunk)
    reset(system, conn)
    return seconds


def measure_latency(
    system: System, conn: psycopg.Connection, *, count: int, pause: float, log: Path
) -> LatencyRun:
    """Probe tasks enqueued one at a time to one idle worker: delay from enqueue call to start."""
    reset(system, conn)
    settle(conn, [])
    with WorkerGroup(
        system.idle_worker_commands(), cwd=system.project_dir, env=system.env(), log=log
    ) as group:
        # Key 0 is a warm-up: once it has run, the worker is up and connected.
        system.drive("latency", "--first-key", "0", "--count", "1", "--pause", "0")
        wait_for_probes(system, conn, group, 1, timeout=60, log=log)
        time.sleep(IDLE_SETTLE)
        result = system.drive(
            "latency", "--first-key", "1", "--count", str(count), "--pause", str(pause)
        )
        wait_for_probes(system, conn, group, count + 1, timeout=60 + count * pause, log=log)
    started = dict(
        conn.execute("SELECT key, started_at FROM bench_started WHERE key >= 1").fetchall()
    )
    enqueued = {int(key): at for key, at in result["enqueued"].items()}
    return LatencyRun([(started[key] - at) * 1000 for key, at in sorted(enqueued.items())])


def measure_mixed(
    system: System,
    conn: psycopg.Connection,
    *,
    commands: list[list[str]],
    workers: int,
    tasks: int,
    rate: float,
    burst: int,
    long_every: int,
    long_seconds: float,
    log: Path,
) -> MixedRun:
    """Short and long tasks enqueued at a steady rate to idle workers: start delays.

    The workers (``commands``, long-running as in production) get one warm-up task
    and are left idle; then the driver enqueues ``tasks`` at ``rate`` per second,
    ``burst`` per call, every ``long_every``-th sleeping ``long_seconds``. Each task
    writes its start time first, as the latency probes do.
    """
    reset(system, conn)
    settle(conn, [])
    with WorkerGroup(commands, cwd=system.project_dir, env=system.env(), log=log) as group:
        system.drive("latency", "--first-key", "0", "--count", "1", "--pause", "0")
        wait_for_probes(system, conn, group, 1, timeout=60, log=log)
        time.sleep(IDLE_SETTLE)
        result = system.drive(
            "mixed",
            "--first-key",
            "1",
            "--count",
            str(tasks),
            "--rate",
            repr(rate),
            "--burst",
            str(burst),
            "--long-every",
            str(long_every),
            "--long-seconds",
            f"{long_seconds:g}",
        )
        # Generous: a system that falls behind still finishes, and shows it in its delays.
        timeout = 60 + tasks * long_seconds / long_every
        wait_for_probes(system, conn, group, tasks + 1, timeout=timeout, log=log)
        # The workers are stopped with SIGTERM and finish their running (long) tasks.
    started = dict(
        conn.execute("SELECT key, started_at FROM bench_started WHERE key >= 1").fetchall()
    )
    enqueued = sorted((int(key), at) for key, at in result["enqueued"].items())
    long_keys = set(result["long_keys"])
    return MixedRun(
        delays_ms=[(started[key] - at) * 1000 for key, at in enqueued],
        long_indexes=[i for i, (key, _) in enumerate(enqueued) if key in long_keys],
        tasks=tasks,
        workers=workers,
        enqueue_seconds=float(result["seconds"]),
        long_seconds=long_seconds,
    )


def wait_for_probes(
    system: System,
    conn: psycopg.Connection,
    group: WorkerGroup,
    count: int,
    *,
    timeout: float,
    log: Path,
) -> None:
    deadline = time.monotonic() + timeout
    while scalar(conn, "SELECT count(*) FROM bench_started") < count:
        if not group.running():
            raise RuntimeError(f"{system.key}: the worker(s) exited; see {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{system.key}: the tasks did not all start in {timeout:g} s; see {log}"
            )
        time.sleep(POLL_INTERVAL)
