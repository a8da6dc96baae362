"""This app's task backend as the modules below ``backend.py`` see it.

``backend.RDBTaskBackend`` implements this class. The enqueue engine
(``enqueueing.py``), workflows (``dependencies.py``), the read replica's
routing (``reads.py``) and the validation of jobs (``job_validation.py``) need
to know whether a task's backend is one of this app's, and read its settings;
they check ``isinstance`` against this class and never import ``backend.py``,
which imports them. It imports nothing of the app's tables, so that
``models/jobs.py`` may use what uses it.
"""

from __future__ import annotations

from abc import abstractmethod

from .compat import BaseTaskBackend, Task, TaskResult
from .conf import BackendOptions
from .limits import Limit
from .storable import StorageLimits


class TaskBackendInterface(BaseTaskBackend):
    """What the modules below the backend read of it: its settings, set by its ``__init__``."""

    #: Its ``OPTIONS``, typed and checked (conf.py): what the modules below read.
    config: BackendOptions
    #: The Django database alias the task rows are written to.
    database: str
    #: Whether an enqueue wakes the workers (NOTIFY, where the database has it).
    notify: bool
    #: Whether the enqueue may keep its statement prepared in the session.
    prepare: bool
    #: ``OPTIONS["MAX_ATTEMPTS"]``: of a task that names none.
    max_attempts: int
    #: What of a task's data may be stored (``storable.py``).
    storage_limits: StorageLimits
    #: ``OPTIONS["QUEUE_LIMITS"]``: queue name to its limit.
    queue_limits: dict[str, Limit]
    #: Bad ``OPTIONS``: reported by the checks, refused by every enqueue.
    option_errors: list[str]

    @abstractmethod
    def max_attempts_for(self, task: Task) -> int:
        """How many attempts ``task`` gets: its own, else the backend's."""

    @abstractmethod
    def send_signal(self, name: str, result: TaskResult) -> None:
        """Send one of the framework's signals (``task_enqueued``...) for ``result``."""
