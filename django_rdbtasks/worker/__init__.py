"""The worker: processes that claim and run tasks, under one supervisor.

- ``loop.Worker``: one process; lane threads claim and run tasks (``lanes``,
  ``execution``), the lease keeper (``keeper``) watches over them.
- ``store.ClaimStore``: every statement the worker makes about tasks.
- ``supervisor.Supervisor``: starts and restarts the processes (``processtree``);
  ``autoscale.AutoscalePolicy``: how many the backlog asks for (``--autoscale``).
- ``scheduler.Scheduler``: fires cron Jobs; ``listener.Listener``: LISTEN/NOTIFY.
"""

from .keeper import EXIT_RECYCLE
from .loop import Worker
from .supervisor import Supervisor

__all__ = ["EXIT_RECYCLE", "Supervisor", "Worker"]
