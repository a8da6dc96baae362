"""The framework's ``Task`` with this backend's options (``@task(max_attempts=...)``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .compat import Task
from .limits import Limit


@dataclass(frozen=True, slots=True, kw_only=True)
class RDBTask(Task):
    """A framework ``Task`` with this backend's options.

    ``max_attempts`` counts every run, the first included; ``backoff`` is the
    base of the exponential delay between retries, in seconds. Either left as
    ``None`` takes the backend's ``OPTIONS``.
    """

    max_attempts: int | None = None
    backoff: float | None = None
    #: At most one READY or RUNNING task per key: a format string over the
    #: task's arguments (``"invoice:{invoice_id}"``) or a callable taking them.
    dedup_key: str | Callable[..., str] | None = None
    #: Run the body inside ``once(<task path>, key)``: its effects commit with a
    #: JobRecord for the key, so a second run with the same key does nothing.
    once_key: str | Callable[..., str] | None = None
    #: Never run two of this task at once, cluster-wide: ``ConcurrencyLimit(1)``.
    singleton: bool = False
    #: A cluster-wide ``ConcurrencyLimit`` or ``RateLimit`` the claim enforces
    #: (limits.py); None: the queue's (``OPTIONS["QUEUE_LIMITS"]``), if any.
    limit: Limit | None = None
    #: Seconds a run may take: then it is asked to stop (``context.should_stop()``);
    #: if it does not within ``OPTIONS["TIMEOUT_GRACE"]``, its process is recycled.
    #: Either way the run fails with ``TaskTimeout`` (retried if attempts remain).
    timeout: float | None = None

    def __post_init__(self) -> None:
        # As the framework's, except that a queue missing from the backend's
        # QUEUES is not refused while the task is made (at import): it is
        # reported by the system checks and refused by enqueue (backend.py).
        backend = self.get_backend()
        getattr(backend, "validate_declaration", backend.validate_task)(self)
