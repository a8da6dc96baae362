"""Throwaway virtualenvs for the peers, so that they never become project dependencies."""

from __future__ import annotations

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
