"""The modules a worker imports to find the project's declarations, and the ones it would miss.

``@task``, ``@periodic`` and ``@record_processor`` declare something only when
their module is imported. A worker imports, once and before its processes fork,
every installed app's ``tasks`` module (as the admin imports every app's
``admin`` module) and each module of ``RDBTASKS_IMPORTS``. ``manage.py check``
imports the same ones, so that what it checks is what the workers will run.

A ``@periodic`` anywhere else (``myapp/cron.py``, a submodule of a ``tasks``
package that its ``__init__`` does not import) would never be scheduled, in
silence: ``periodic_outside_task_modules`` finds such modules in the project's
own apps by reading their source, without importing them, for a warning.
"""

from __future__ import annotations

import ast
import importlib
import os
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass

from django.apps import apps
from django.utils.module_loading import module_has_submodule

from .conf import project_settings

#: The submodule of every installed app a worker imports.
TASKS_MODULE = "tasks"
#: Directories of an app never read for declarations.
SKIPPED_DIRECTORIES = frozenset(
    {"migrations", "__pycache__", "node_modules", "static", "templates"}
)


def task_module_names() -> list[str]:
    """The modules a worker imports, in the order it does: apps' ``tasks``, then the setting."""
    names = [
        f"{config.name}.{TASKS_MODULE}"
        for config in apps.get_app_configs()
        if config.module is not None and module_has_submodule(config.module, TASKS_MODULE)
    ]
    names += project_settings().imports
    return list(dict.fromkeys(names))


def import_task_modules() -> None:
    """Import them all; the first that fails raises (a worker must not start without it)."""
    for name in task_module_names():
        importlib.import_module(name)


def task_module_failures() -> dict[str, BaseException]:
    """Import them all; the ones that failed and why (for a system check: all at once)."""
    failures: dict[str, BaseException] = {}
    for name in task_module_names():
        try:
            importlib.import_module(name)
        except Exception as exc:
            failures[name] = exc
    return failures


@dataclass(frozen=True, slots=True)
class PeriodicModule:
    """A module of the project that declares ``@periodic`` jobs and that nothing imported."""

    module: str
    path: str
    #: The decorated functions, by name.
    functions: tuple[str, ...]


def periodic_outside_task_modules() -> list[PeriodicModule]:
    """Modules of the project's apps using ``@periodic`` that are not imported by now.

    Called after ``import_task_modules``: a module imported by then (a ``tasks``
    module, one of ``RDBTASKS_IMPORTS``, or anything those or the models import)
    is one every worker has; any other would never be scheduled. Only the
    project's own apps are read (not installed packages), and only files that
    mention ``periodic``.
    """
    found = []
    for module, path in _project_modules():
        if module in sys.modules:
            continue
        functions = _periodic_functions(path)
        if functions:
            found.append(PeriodicModule(module, path, functions))
    return found


def _project_modules() -> Iterator[tuple[str, str]]:
    """(module name, file) of every Python file of the apps that are not installed packages."""
    installed = {
        os.path.realpath(path)
        for key in ("purelib", "platlib", "stdlib")
        if (path := sysconfig.get_paths().get(key))
    }
    for config in apps.get_app_configs():
        root = os.path.realpath(config.path)
        if any(root == place or root.startswith(place + os.sep) for place in installed):
            continue
        for directory, subdirectories, files in os.walk(root):
            subdirectories[:] = [
                name
                for name in subdirectories
                if name not in SKIPPED_DIRECTORIES
                and not name.startswith(".")
                # A package only: a directory without __init__.py is no module of the app.
                and os.path.exists(os.path.join(directory, name, "__init__.py"))
            ]
            relative = os.path.relpath(directory, root)
            package = (
                config.name if relative == "." else ".".join([config.name, *relative.split(os.sep)])
            )
            for file in files:
                if not file.endswith(".py"):
                    continue
                stem = file[:-3]
                yield (
                    (package if stem == "__init__" else f"{package}.{stem}"),
                    os.path.join(directory, file),
                )


def _periodic_functions(path: str) -> tuple[str, ...]:
    """The functions of the file decorated with ``@periodic(...)`` (this app's, imported)."""
    try:
        with open(path, encoding="utf-8") as file:
            source = file.read()
    except (OSError, UnicodeDecodeError):
        return ()
    if "periodic" not in source or "django_rdbtasks" not in source:
        return ()
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError:
        return ()
    return tuple(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(_is_periodic(decorator) for decorator in node.decorator_list)
    )


def _is_periodic(decorator: ast.expr) -> bool:
    """``@periodic(...)`` or ``@jobs.periodic(...)``."""
    call = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(call, ast.Name) and call.id == "periodic") or (
        isinstance(call, ast.Attribute) and call.attr == "periodic"
    )
