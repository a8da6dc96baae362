"""Cluster-wide limits a task is claimed under: concurrency and rate.

``ConcurrencyLimit(3, key=...)``: at most 3 tasks with the same key RUNNING at
once. ``RateLimit(20, period=1)``: at most 20 starts per key in any window of
one second. The key is computed at enqueue from the task's arguments and
stored on the row with the limit (``Task.limit_key``, ``limit_count``,
``limit_period``); the claim takes one of the key's ``LimitSlot`` rows in the
transaction that claims the task, or leaves the task READY (docs/limits.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .compat import InvalidTask
from .keys import task_key
from .states import LimitKind

#: Longest stored key (``LimitSlot.key``), the kind's prefix included.
MAX_KEY_LENGTH = 200

KeySource = str | Callable[..., Any] | None


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a whole number of at least 1, not {value!r}.")
    return value


@dataclass(frozen=True, slots=True)
class ConcurrencyLimit:
    """At most ``limit`` tasks of one key RUNNING at once, cluster-wide.

    ``key``: a format string over the task's arguments (``"customer:{customer_id}"``),
    a callable taking them, or None for one key per task (its path).
    """

    limit: int
    key: KeySource = None

    def __post_init__(self) -> None:
        _count(self.limit, "A concurrency limit")
        _check_key_source(self.key)

    @property
    def kind(self) -> LimitKind:
        return LimitKind.CONCURRENCY

    @property
    def seconds(self) -> float:
        return 0.0


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``limit`` starts of one key in any window of ``period``, cluster-wide."""

    limit: int
    period: float | timedelta = 1.0
    key: KeySource = None

    def __post_init__(self) -> None:
        _count(self.limit, "A rate limit")
        seconds = self.period.total_seconds() if isinstance(self.period, timedelta) else self.period
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ValueError(
                f"A rate limit's period must be seconds or a timedelta, not {seconds!r}."
            )
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"A rate limit's period must be positive, not {seconds!r}.")
        _check_key_source(self.key)

    @property
    def kind(self) -> LimitKind:
        return LimitKind.RATE

    @property
    def seconds(self) -> float:
        period = self.period
        return float(period.total_seconds() if isinstance(period, timedelta) else period)


Limit = ConcurrencyLimit | RateLimit


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """What the row stores: the key (its kind prefixed), the slot count, the period."""

    key: str
    count: int
    period: float


def _check_key_source(key: Any) -> None:
    if key is not None and not (isinstance(key, str) or callable(key)):
        raise ValueError(f"A limit's key must be a format string or a callable, not {key!r}.")


@dataclass(frozen=True, slots=True)
class QueueLimit:
    """A queue's limit (``OPTIONS["QUEUE_LIMITS"]``): its default key is the queue's."""

    limit: Limit


def limit_for(task: Any, queue_limits: Mapping[str, Limit]) -> Limit | QueueLimit | None:
    """The limit a task runs under: its own, ``singleton``, else its queue's."""
    own = getattr(task, "limit", None)
    if own is not None:
        return own
    if getattr(task, "singleton", False):
        return ConcurrencyLimit(1)
    queue = queue_limits.get(task.queue_name)
    return None if queue is None else QueueLimit(queue)


def validate_limit(task: Any) -> None:
    """Refuse a task whose limit option is not a limit, or that combines it with singleton."""
    own = getattr(task, "limit", None)
    if own is None:
        return
    if not isinstance(own, ConcurrencyLimit | RateLimit):
        raise InvalidTask("limit must be a ConcurrencyLimit or a RateLimit.")
    if getattr(task, "singleton", False):
        raise InvalidTask("singleton is ConcurrencyLimit(1): give one of limit and singleton.")


def limit_spec(
    which: Limit | QueueLimit, task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> LimitSpec:
    """The stored limit of one enqueue: the key computed from the arguments.

    Raises ``InvalidTask`` (nothing is enqueued) when the key cannot be
    computed or is too long.
    """
    queue = isinstance(which, QueueLimit)
    limit = which.limit if isinstance(which, QueueLimit) else which
    if limit.key is None:
        name = f"queue:{task.queue_name}" if queue else task.module_path
    else:
        try:
            name = task_key(limit.key, task, args, kwargs, what="Limit key")
        except InvalidTask:
            raise
        except Exception as exc:
            raise InvalidTask(
                f"The {limit.kind} limit's key of {task.module_path} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    key = f"{limit.kind}:{name}"
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidTask(f"A limit key is at most {MAX_KEY_LENGTH} characters: {key[:60]!r}...")
    return LimitSpec(key, limit.limit, limit.seconds)


def queue_limits_option(raw: Any) -> tuple[dict[str, Limit], list[str]]:
    """``OPTIONS["QUEUE_LIMITS"]``: queue name to a limit; and what is wrong with it."""
    if raw is None:
        return {}, []
    if not isinstance(raw, Mapping):
        return {}, ["OPTIONS['QUEUE_LIMITS'] must map queue names to limits."]
    limits: dict[str, Limit] = {}
    errors = []
    for queue, limit in raw.items():
        if not isinstance(limit, ConcurrencyLimit | RateLimit):
            errors.append(
                f"OPTIONS['QUEUE_LIMITS'][{queue!r}] must be a ConcurrencyLimit or a RateLimit."
            )
        elif callable(limit.key):
            errors.append(
                f"OPTIONS['QUEUE_LIMITS'][{queue!r}]: a queue's limit key is a format "
                "string or None, not a callable."
            )
        else:
            limits[str(queue)] = limit
    return limits, errors
