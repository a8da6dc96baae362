class RDBTasksError(Exception):
    """Base class of this package's errors."""


class ArgumentsNotJSON(RDBTasksError, TypeError):
    """Task arguments that JSON cannot round-trip unchanged."""


class InvalidTaskPath(RDBTasksError):
    """A row names something that is not a framework Task this worker may run."""


class WorkerLost(RDBTasksError):
    """Recorded as the error of an attempt whose worker stopped renewing its lease."""


class ReturnValueNotJSON(RDBTasksError):
    """A task returned a value that cannot be stored as JSON."""


class TaskCancelled(RDBTasksError):
    """Recorded as the error of a task an operator cancelled."""
