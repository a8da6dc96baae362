"""The exit codes of a worker process, and what each says about how it ended.

The supervisor restarts, logs and marks the registration of a process it saw
end; the exit status is all it learns, so each way of ending has its own.
"""

from __future__ import annotations

import signal

#: ``--max-tasks`` reached: replaced at once.
EXIT_RECYCLE = 3
#: A task ran past its timeout and did not stop when asked: replaced at once.
EXIT_TIMED_OUT = 4
#: A second SIGTERM/SIGINT: left at once, claims to their leases.
EXIT_AT_ONCE = 5

#: Exits after which the supervisor starts a new process at once (no crash pause).
RECYCLED = frozenset({EXIT_RECYCLE, EXIT_TIMED_OUT})


def exit_reason(code: int | None) -> str:
    """How a process that exited with ``code`` (negative: killed by that signal) ended."""
    if code == 0:
        return "stopped"
    if code == EXIT_RECYCLE:
        return "recycled after --max-tasks"
    if code == EXIT_TIMED_OUT:
        return "recycled: a task ran past its timeout and did not stop"
    if code == EXIT_AT_ONCE:
        return "exited at once on a second signal"
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with {code}"
