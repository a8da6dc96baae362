class RDBTasksError(Exception):
    """Base class of this package's errors."""


class ArgumentsNotJSON(RDBTasksError, TypeError):
    """Task arguments that JSON cannot round-trip unchanged."""


class InvalidTaskPath(RDBTasksError):
    """A row names something that is not a framework Task this worker may run."""


class WorkerLost(RDBTasksError):
    """Recorded as the error of an attempt whose worker stopped renewing its lease."""


class TaskCancelled(RDBTasksError):
    """Recorded as the error of a task an operator cancelled."""


class TaskTimeout(RDBTasksError):
    """Recorded as the error of a task that ran past its ``timeout``."""


class HandOver(Exception):
    """Raised by a task to give itself back to the queue, checkpoint kept, attempt unspent."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(f"handed over (resume in {delay:g}s)")
        self.delay = delay
