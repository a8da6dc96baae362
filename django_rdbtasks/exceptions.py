"""This package's errors, and how any error is named where it is stored."""


def error_path(error: BaseException) -> str:
    """The dotted path of the error's class, as a history entry names it."""
    return f"{type(error).__module__}.{type(error).__qualname__}"


def error_summary(error: BaseException) -> str:
    """``path.to.Error: message``, the class named once."""
    path = error_path(error)
    message = str(error)
    return f"{path}: {message}" if message else path


class RDBTasksError(Exception):
    """Base class of this package's errors."""


class ArgumentsNotJSON(RDBTasksError, TypeError):
    """Task arguments that JSON cannot round-trip unchanged."""


class ValueNotStorable(RDBTasksError, ValueError):
    """A task's data that a supported database would refuse (``storable.py``).

    Raised in the task (a checkpoint, progress), or recorded as the error of a
    task whose result, or whose outcome as a whole, a database refused. Not
    retried: the same value would be refused again.
    """

    retryable = False


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
