"""The command line shared by the per-system drivers.

Each driver runs inside its own system's virtualenv (the peers must not share
one with django-rdbtasks), so this module uses the standard library only and
is imported by putting ``bench/`` on ``sys.path``.

A driver only enqueues; the harness in ``run.py`` owns the database, the
workers and the clock that times a drain. Results go back as one JSON line on
stdout, prefixed with ``RESULT_PREFIX`` so that stray output cannot be misread.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

RESULT_PREFIX = "BENCH-RESULT "


@dataclass(frozen=True)
class Driver:
    """What a system provides to enqueue the benchmark's tasks."""

    #: Open connections/pools so that connecting is not timed as enqueueing.
    prepare: Callable[[], None]
    #: Enqueue one no-op task in its own transaction.
    enqueue_one: Callable[[], None]
    #: Enqueue this many no-op tasks with one call of the system's bulk API.
    enqueue_many: Callable[[int], None]
    #: Enqueue one task that records when it started, under this key.
    enqueue_keyed: Callable[[int], None]
    #: Close what ``prepare`` opened.
    close: Callable[[], None] = lambda: None
    #: Enqueue the mixed load's task ``mixed(key, seconds)`` (record its start, then sleep
    #: ``seconds``) once per ``(key, seconds)`` pair, all in one transaction: one ordinary
    #: enqueue call for a single pair, the system's bulk API for more. None: not supported.
    enqueue_mixed: Callable[[Sequence[tuple[int, float]]], None] | None = None
    #: Enqueue this many no-op tasks with the ordinary one-task call (``enqueue_one``'s),
    #: all of them inside one transaction that commits at the end. None: not supported.
    enqueue_in_transaction: Callable[[int], None] | None = None
    #: Enqueue this many no-op tasks one per transaction, as ``enqueue_one`` in a loop
    #: would. For asyncio drivers: their loop then runs inside the event loop, rather
    #: than entering the loop once per task (which would add its cost to every enqueue).
    enqueue_each: Callable[[int], None] | None = None


def time_single(driver: Driver, count: int) -> float:
    start = time.perf_counter()
    if driver.enqueue_each is not None:
        driver.enqueue_each(count)
    else:
        for _ in range(count):
            driver.enqueue_one()
    return time.perf_counter() - start


def time_in_transaction(driver: Driver, count: int, chunk: int) -> float:
    """``count`` ordinary enqueue calls, ``chunk`` of them in each transaction."""
    if driver.enqueue_in_transaction is None:
        raise SystemExit("this driver cannot enqueue inside a transaction")
    start = time.perf_counter()
    remaining = count
    while remaining > 0:
        size = min(chunk, remaining)
        driver.enqueue_in_transaction(size)
        remaining -= size
    return time.perf_counter() - start


def time_bulk(driver: Driver, count: int, chunk: int) -> float:
    start = time.perf_counter()
    remaining = count
    while remaining > 0:
        size = min(chunk, remaining)
        driver.enqueue_many(size)
        remaining -= size
    return time.perf_counter() - start


def enqueue_for_latency(driver: Driver, keys: Sequence[int], pause: float) -> dict[int, float]:
    """Enqueue one keyed task at a time; return the wall time just before each call.

    Wall-clock (``time.time``) because the task compares it with its own
    start time in another process; both run on this machine's clock.
    """
    enqueued: dict[int, float] = {}
    for key in keys:
        enqueued[key] = time.time()
        driver.enqueue_keyed(key)
        time.sleep(pause)
    return enqueued


def enqueue_mixed_load(
    driver: Driver,
    *,
    first_key: int,
    count: int,
    rate: float,
    burst: int,
    long_every: int,
    long_seconds: float,
) -> dict[str, object]:
    """Enqueue ``count`` mixed tasks at ``rate`` per second, ``burst`` per call.

    Task ``i`` (from 0) sleeps ``long_seconds`` if ``i % long_every == long_every // 2``
    (the middle of each run of ``long_every``), else nothing. Calls are scheduled on a
    fixed timetable (call ``n`` at ``n * burst / rate`` seconds), so that a slow call does
    not shift the ones after it. Returns the wall time just before each task's call.
    """
    if driver.enqueue_mixed is None:
        raise SystemExit("this driver has no mixed load")
    enqueued: dict[int, float] = {}
    long_keys: list[int] = []
    interval = burst / rate
    start = time.monotonic()
    for call, first in enumerate(range(0, count, burst)):
        delay = start + call * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        items = []
        for index in range(first, min(first + burst, count)):
            key = first_key + index
            seconds = long_seconds if index % long_every == long_every // 2 else 0.0
            if seconds:
                long_keys.append(key)
            items.append((key, seconds))
        at = time.time()
        driver.enqueue_mixed(items)
        for key, _ in items:
            enqueued[key] = at
    return {
        "enqueued": enqueued,
        "long_keys": long_keys,
        "seconds": time.monotonic() - start,
    }


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Enqueue benchmark tasks.")
    sub = parser.add_subparsers(dest="command", required=True)
    enqueue = sub.add_parser("enqueue", help="enqueue no-op tasks and time it")
    enqueue.add_argument(
        "--mode",
        choices=["single", "transaction", "bulk"],
        required=True,
        help="one per transaction; --chunk ordinary calls per transaction; bulk calls of --chunk",
    )
    enqueue.add_argument("--count", type=int, required=True)
    enqueue.add_argument(
        "--chunk", type=int, default=1000, help="tasks per bulk call or per transaction"
    )
    latency = sub.add_parser("latency", help="enqueue keyed tasks one at a time")
    latency.add_argument("--first-key", type=int, required=True)
    latency.add_argument("--count", type=int, required=True)
    latency.add_argument("--pause", type=float, default=0.02)
    mixed = sub.add_parser("mixed", help="enqueue short and long tasks at a steady rate")
    mixed.add_argument("--first-key", type=int, required=True)
    mixed.add_argument("--count", type=int, required=True)
    mixed.add_argument("--rate", type=float, required=True, help="tasks per second")
    mixed.add_argument("--burst", type=int, default=1, help="tasks per enqueue call")
    mixed.add_argument("--long-every", type=int, default=100)
    mixed.add_argument("--long-seconds", type=float, default=2.0)
    return parser.parse_args(argv)


def main(driver: Driver, argv: Sequence[str] | None = None) -> None:
    args = _parse(argv)
    driver.prepare()
    try:
        if args.command == "enqueue":
            cpu = time.process_time()
            if args.mode == "single":
                seconds = time_single(driver, args.count)
            elif args.mode == "transaction":
                seconds = time_in_transaction(driver, args.count, args.chunk)
            else:
                seconds = time_bulk(driver, args.count, args.chunk)
            # The driver's own CPU (client library, framework, encoding), beside the wall time.
            cpu_seconds = time.process_time() - cpu
            result: dict[str, object] = {
                "count": args.count,
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
            }
        elif args.command == "latency":
            keys = range(args.first_key, args.first_key + args.count)
            result = {"enqueued": enqueue_for_latency(driver, keys, args.pause)}
        else:
            result = enqueue_mixed_load(
                driver,
                first_key=args.first_key,
                count=args.count,
                rate=args.rate,
                burst=args.burst,
                long_every=args.long_every,
                long_seconds=args.long_seconds,
            )
    finally:
        driver.close()
    print(RESULT_PREFIX + json.dumps(result), flush=True)
