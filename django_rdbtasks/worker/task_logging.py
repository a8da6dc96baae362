"""One record per task a worker runs: the worker's line, in place of the framework's two.

The Tasks framework's receivers of ``task_started`` and ``task_finished`` log
``Task id=... path=... state=RUNNING`` and ``... state=SUCCESSFUL`` (or
``FAILED``, at ERROR with the traceback) to its logger, ``django.tasks``
(``django_tasks`` for the backport), for every task the signals are sent for.
A worker must send both signals (projects' receivers count on them), and its
own line already says what became of the task, and more: three records per
task, two of them out of reach of ``runworkers --log-level``, since they are
the framework's logger's, which Django's default logging sends to the console
at INFO whatever the root logger's level.

So while a worker sends those two signals, a filter on the framework's loggers
drops the records of the framework's two receivers, and nothing else: not the
records of the same receivers for a task run elsewhere in the process (an
``ImmediateBackend``'s), nor the ``enqueued`` records, nor anything a project's
own receiver logs there. The worker's line (logger ``django_rdbtasks.worker``,
``worker/reporting.py``) carries what they said: the task's id, path and state,
and for a failure the exception with its traceback, at ERROR, so that an error
tracker still gets exactly one event per failure, with the task's own stack.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

#: The framework's loggers: Django 6.1's and the backport's.
FRAMEWORK_LOGGERS = ("django.tasks", "django_tasks")
#: The framework's receivers whose records the worker's line replaces.
REPLACED_RECEIVERS = frozenset({"log_task_started", "log_task_finished"})

_sending = threading.local()


class ToldByTheWorker(logging.Filter):
    """Drops the framework's per-task records while this thread's worker sends a signal."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (getattr(_sending, "active", False) and record.funcName in REPLACED_RECEIVERS)


_filter = ToldByTheWorker()


def install() -> None:
    """Put the filter on the framework's loggers (once per process; idempotent)."""
    for name in FRAMEWORK_LOGGERS:
        logger = logging.getLogger(name)
        if _filter not in logger.filters:
            logger.addFilter(_filter)


def send_signal(backend: Any, name: str, result: Any) -> None:
    """``backend.send_signal(name, result)``, its framework records dropped (see above)."""
    _sending.active = True
    try:
        backend.send_signal(name, result)
    finally:
        _sending.active = False
