"""Worker processes the harness starts, watches and always stops."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType


class WorkerGroup:
    """Start one or more worker commands; stop them (and their children) on exit.

    Each command gets its own session, so that one signal to its process group
    reaches whatever it forked (django-rdbtasks' ``runworkers`` is a supervisor
    with child processes) and nothing else.
    """

    def __init__(
        self, commands: Sequence[Sequence[str]], *, cwd: Path, env: Mapping[str, str], log: Path
    ) -> None:
        self.commands = [list(command) for command in commands]
        self.cwd = cwd
        self.env = dict(env)
        self.log_path = log
        self.processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> WorkerGroup:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        try:
            for command in self.commands:
                log.write(f"$ {' '.join(command)}\n".encode())
                log.flush()
                self.processes.append(
                    subprocess.Popen(
                        command,
                        cwd=self.cwd,
                        env=self.env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        finally:
            log.close()  # the children hold their own copies
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def running(self) -> int:
        return sum(1 for process in self.processes if process.poll() is None)

    def wait_exit(self, timeout: float) -> bool:
        """Wait for the workers to exit by themselves (burst/one-shot mode)."""
        deadline = time.monotonic() + timeout
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.running()

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM each group, SIGKILL whatever is still there after ``grace`` seconds."""
        self._signal_all(signal.SIGTERM)
        if not self.wait_exit(grace):
            self._signal_all(signal.SIGKILL)
            self.wait_exit(5.0)
        for process in self.processes:
            # A supervisor may be gone while its children linger; the group id is the pid.
            self._signal_group(process.pid, signal.SIGKILL)

    def _signal_all(self, signum: signal.Signals) -> None:
        for process in self.processes:
            if process.poll() is None:
                self._signal_group(process.pid, signum)

    @staticmethod
    def _signal_group(pgid: int, signum: signal.Signals) -> None:
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass
