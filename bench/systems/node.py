"""What the Node peers share: an npm environment with Node 22, scripts in bench/peers/.

Each Node peer gets its own npm prefix under ``bench/.envs/`` (``core.envs.ensure_node_env``)
holding its packages and the official Node 22 binary it runs on; its scripts
(``bench/peers/*.mjs``) find the packages through ``BENCH_NODE_ENV``. The driver speaks
the same command line as the Python drivers (``bench/peers/driverlib.mjs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from core.envs import ensure_node_env, node_package_version

from .base import BENCH_DIR, System


class NodeSystem(System):
    #: npm packages, pinned to the version measured.
    packages: ClassVar[list[str]]
    #: The script with ``setup`` and ``work [--drain]``, and the enqueue driver.
    app_script: ClassVar[str]
    driver_script: ClassVar[str]

    @property
    def env_dir(self) -> Path:
        return self.context.envs_dir / self.key

    @property
    def project_dir(self) -> Path:
        return BENCH_DIR / "peers"

    @property
    def driver_argv(self) -> list[str]:
        return [self.interpreter, self.driver_script]

    def prepare_env(self) -> None:
        # self.python is the env's node: the "interpreter" of this system's commands.
        self.python = ensure_node_env(
            self.env_dir, self.packages, reinstall=self.context.reinstall_envs
        )

    def version(self) -> str:
        return node_package_version(self.env_dir, self.distribution)

    def env(self) -> dict[str, str]:
        return {**super().env(), "BENCH_NODE_ENV": str(self.env_dir)}

    def create_schema(self) -> None:
        self.run([self.interpreter, self.app_script, "setup"])

    def drain_commands(self, workers: int) -> list[list[str]]:
        return [[self.interpreter, self.app_script, "work", "--drain"]] * workers

    def idle_worker_commands(
        self, workers: int = 1, worker_args: Sequence[str] | None = None
    ) -> list[list[str]]:
        return [[self.interpreter, self.app_script, "work"]] * workers
