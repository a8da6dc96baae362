"""Keeping a supervisor and its children one tree: no child outlives its supervisor.

Children stay in the supervisor's process group (so ``kill -- -PGID`` reaches
every one), ask the kernel for SIGTERM when their parent dies (Linux's
``PR_SET_PDEATHSIG``), and also watch ``getppid()`` as a fallback where that
is not available. A child whose parent died stops with a short grace.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys

logger = logging.getLogger("django_rdbtasks.worker")

PR_SET_PDEATHSIG = 1
#: Longest an orphaned worker lets its running tasks finish before releasing them.
ORPHAN_GRACE = 2.0


def die_with_parent(expected_parent: int, signum: int = signal.SIGTERM) -> bool:
    """Have the kernel send ``signum`` when the parent dies; True if that was set.

    Exits at once if the parent is already gone (it may have died between
    the fork and this call, when no signal would come).
    """
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
        except OSError:
            armed = False
    if os.getppid() != expected_parent:
        os._exit(1)
    return armed


class ParentWatch:
    """Tells a supervised process that its supervisor is gone (None: not supervised)."""

    def __init__(self, parent_pid: int | None) -> None:
        self.parent_pid = parent_pid

    def orphaned(self) -> bool:
        return self.parent_pid is not None and os.getppid() != self.parent_pid
