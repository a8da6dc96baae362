"""One record per task a worker runs: the worker's line, in place of the framework's two.

The Tasks framework's receivers of ``task_started`` and ``task_finished`` log
``Task id=... path=... state=RUNNING`` and ``... state=SUCCESSFUL`` (or
``FAILED``, at ERROR with the traceback) to its logger, ``django.tasks``
(``django_tasks`` for the backport), for every task the signals are sent for.
A worker must send both signals (projects' receivers count on them; where
there are none, sending calls nothing and is skipped: ``send_signal``), and
its own line already says what became of the task, and more: three records per
task, two of them out of reach of ``runworkers --log-level``, since they are
the framework's logger's, which Django's default logging sends to the console
at INFO whatever the root logger's level.

So in a worker process those two receivers are connected through a guard
that does not call them while this thread's worker is sending the signal:
their records are never made (making a record, with its caller's lookup, was
the larger part of what logging cost a task on Django 6.1: docs/benchmarks.md,
"Per-task CPU: the framework's records not even made"). Nothing else
changes: the same receivers still log the signals anything else in the process
sends (an ``ImmediateBackend`` running a task in a request), the ``enqueued``
records stay, and so does anything a project's own receiver logs there. A
project that disconnected one of the two receivers keeps it disconnected. The
worker's line (logger ``django_rdbtasks.worker``, ``worker/reporting.py``)
carries what they said: the task's id, path and state, and for a failure the
exception with its traceback, at ERROR, so that an error tracker still gets
exactly one event per failure, with the task's own stack.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..backend import RDBTaskBackend
from ..compat import framework_signals

#: The framework's receivers whose records the worker's line replaces, by signal.
REPLACED_RECEIVERS = {"task_started": "log_task_started", "task_finished": "log_task_finished"}

_sending = threading.local()
_install_lock = threading.Lock()


class UnlessTheWorkerSends:
    """A framework receiver, called for every sender but this thread's worker."""

    def __init__(self, receiver: Callable[..., Any]) -> None:
        self.receiver = receiver

    def __call__(self, sender: Any, **kwargs: Any) -> Any:
        if getattr(_sending, "active", False):
            return None
        return self.receiver(sender, **kwargs)


def install() -> None:
    """Guard the framework's two receivers (once per process; idempotent)."""
    with _install_lock:
        for signal_name, receiver_name in REPLACED_RECEIVERS.items():
            signal = getattr(framework_signals, signal_name)
            receiver = getattr(framework_signals, receiver_name, None)
            # Disconnected already: guarded by an earlier call, or by the project.
            if receiver is None or not signal.disconnect(receiver):
                continue
            signal.connect(
                UnlessTheWorkerSends(receiver),
                weak=False,
                dispatch_uid=f"django_rdbtasks.worker.{receiver_name}",
            )


def only_guarded(signal: Any) -> bool:
    """Whether every receiver of ``signal`` is a guard, which the worker's own
    sending does not call: then sending it calls nothing.

    Read off the signal's list of receivers each time (an entry's second item
    is the receiver, or a weak reference to it): a receiver a project connects
    later, or one of the two it disconnects, counts from the next task on.
    """
    # A loop, not all() over a generator: asked twice a task.
    for entry in signal.receivers:
        if type(entry[1]) is not UnlessTheWorkerSends:
            return False
    return True


def sends(backend: Any, name: str) -> bool:
    """Whether ``send_signal(backend, name, ...)`` would send the signal now."""
    return type(backend).send_signal is not RDBTaskBackend.send_signal or not only_guarded(
        getattr(framework_signals, name)
    )


def send_signal(backend: Any, name: str, result: Any) -> None:
    """``backend.send_signal(name, result)``, without the framework's records (see above).

    A signal whose only receivers are the guards is not sent: Django's
    ``Signal.send`` would look its receivers up (a lock, the sender's id, each
    one's reference) to call none of them, about 2 µs a signal, two a task
    (docs/benchmarks.md, "A quiet sitting"). A backend whose class overrides
    ``send_signal`` is called for every task, as before.
    """
    if not sends(backend, name):
        return
    _sending.active = True
    try:
        backend.send_signal(name, result)
    finally:
        _sending.active = False
