"""Testing code that enqueues tasks: run them in-process, move the clock, assert.

    from django_rdbtasks.testing import Harness, captured_tasks, drain

    def test_invoice_is_sent(rdbtasks):          # the pytest fixture (pytest-django)
        invoice = Invoice.objects.create(...)    # enqueues send_invoice in its transaction
        rdbtasks.assert_enqueued(send_invoice, args=[invoice.pk])
        report = rdbtasks.drain()                # runs it here, as a worker would
        assert report.succeeded

See docs/testing.md: the three ways to test tasks, and what each proves.
"""

from .capture import (
    CapturedTasks,
    Enqueued,
    assert_enqueued,
    assert_not_enqueued,
    captured_tasks,
    enqueued_tasks,
)
from .clock import TaskClock
from .harness import Harness
from .runner import DrainReport, InProcessRunner, RanTask, TaskLeftTransactionOpen, drain, tick_jobs

#: ``drain`` under the name other queues' testing helpers use.
run_tasks = drain

__all__ = [
    "CapturedTasks",
    "DrainReport",
    "Enqueued",
    "Harness",
    "InProcessRunner",
    "RanTask",
    "TaskClock",
    "TaskLeftTransactionOpen",
    "assert_enqueued",
    "assert_not_enqueued",
    "captured_tasks",
    "drain",
    "enqueued_tasks",
    "run_tasks",
    "tick_jobs",
]
