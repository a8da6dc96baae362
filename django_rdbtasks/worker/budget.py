"""``--max-tasks``: how many more tasks this process may run before it recycles."""

from __future__ import annotations

import threading


class TaskBudget:
    """Shared by the process's lanes, which take from it as they claim and give back
    what they did not get; the keeper gives back what it hands back unstarted, so the
    budget counts tasks that ran, not claims. ``None``: no limit."""

    def __init__(self, max_tasks: int | None) -> None:
        self._left = max_tasks
        self._lock = threading.Lock()

    def take(self, want: int) -> int:
        """Up to ``want`` of what is left (0 once it is spent)."""
        if self._left is None:
            return want
        with self._lock:
            take = max(0, min(want, self._left))
            self._left -= take
            return take

    def give_back(self, unused: int) -> None:
        if self._left is not None and unused > 0:
            with self._lock:
                self._left += unused
