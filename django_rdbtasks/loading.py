"""Find the framework ``Task`` a row names, and nothing else.

A row's ``task_path`` comes from the database, so it is never trusted: only
modules of installed apps (or modules already imported) are imported, and the
object found must be a framework ``Task`` whose own path is the row's path.
Nothing found at a path is ever called unless it passes those checks.
"""

from __future__ import annotations

import importlib
import sys
from functools import cache
from typing import cast

from django.apps import apps
from django.conf import settings

from .compat import TASK_BASE_CLASSES, Task
from .exceptions import InvalidTaskPath

_loaded: dict[str, Task | InvalidTaskPath] = {}


class TaskNotHere(InvalidTaskPath):
    """A well-formed path under an allowed module that this code does not have.

    The module (or the task in it) is missing, as it is from a worker of an
    older release while a newer one is rolled out: another worker may run it.
    """


@cache
def _allowed_prefixes() -> tuple[str, ...]:
    names = [config.name for config in apps.get_app_configs()]
    names += list(getattr(settings, "RDBTASKS_TASK_MODULES", []))
    return tuple(names)


def _may_import(module_name: str) -> bool:
    return module_name in sys.modules or _in_allowed_package(module_name)


def _in_allowed_package(module_name: str) -> bool:
    return any(
        module_name == prefix or module_name.startswith(prefix + ".")
        for prefix in _allowed_prefixes()
    )


def _outside_apps(path: str, module_name: str) -> InvalidTaskPath:
    return InvalidTaskPath(
        f"{path!r}: module {module_name!r} is not part of an installed app "
        "(add its package to RDBTASKS_TASK_MODULES to allow it)."
    )


def _load(path: str) -> Task:
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute.isidentifier():
        raise InvalidTaskPath(f"{path!r} is not a dotted path to a task.")
    if not _may_import(module_name):
        raise _outside_apps(path, module_name)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if _is_missing(exc, module_name):
            raise TaskNotHere(
                f"{path!r}: this worker's code has no module {module_name!r} ({exc})"
            ) from exc
        raise InvalidTaskPath(f"{path!r}: cannot import {module_name!r}: {exc}") from exc
    if not hasattr(module, attribute):
        # Under an allowed module: a later release may have it (TaskNotHere).
        raise TaskNotHere(f"{path!r}: module {module_name!r} has no {attribute!r}.")
    found = getattr(module, attribute)
    if not isinstance(found, TASK_BASE_CLASSES):
        raise InvalidTaskPath(
            f"{path!r} is not a task: found {type(found).__name__}, "
            "expected an object made with the @task decorator."
        )
    # The framework's Task or the backport's, which has the same interface.
    task = cast(Task, found)
    if task.module_path != path:
        raise InvalidTaskPath(f"{path!r} is an alias of the task {task.module_path!r}.")
    return task


def _is_missing(exc: ImportError, module_name: str) -> bool:
    """The module itself (or a package above it) is not there; not: it failed to import."""
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    return bool(missing) and (module_name == missing or module_name.startswith(f"{missing}."))


def load_task(path: str) -> Task:
    """Return the task at ``path`` or raise ``InvalidTaskPath``; cached either way."""
    known = _loaded.get(path)
    if known is None:
        try:
            known = _load(path)
        except InvalidTaskPath as exc:
            known = exc
        _loaded[path] = known
    if isinstance(known, InvalidTaskPath):
        raise known
    return known


_reachable: dict[str, InvalidTaskPath | None] = {}


def check_loadable(path: str) -> None:
    """Raise ``InvalidTaskPath`` unless a worker would find a task at ``path``.

    What ``load_task`` would say in a worker, said where the task is enqueued.
    Here the task's module is imported whatever it is, so ``sys.modules``
    proves nothing: a worker imports only installed apps and
    ``RDBTASKS_TASK_MODULES``, and its ``__main__`` is ``manage.py``, not the
    script that defined the task. Cached per path: one import at most.
    """
    try:
        refused = _reachable[path]
    except KeyError:
        # Read into a local: another thread may clear the cache between the
        # store and a second look-up.
        refused = _unreachable(path)
        if len(_reachable) >= 1024:
            _reachable.clear()
        _reachable[path] = refused
    if refused is not None:
        raise refused


def _unreachable(path: str) -> InvalidTaskPath | None:
    module_name = path.rpartition(".")[0]
    if module_name == "__main__" or module_name.startswith("__main__."):
        return InvalidTaskPath(
            f"{path!r} is defined in __main__, the script this process runs, which a "
            "worker cannot import: define the task in a module of an installed app."
        )
    try:
        _load(path)  # what a worker says first, where it would say anything
    except InvalidTaskPath as exc:
        return exc
    if not _in_allowed_package(module_name):
        return _outside_apps(path, module_name)
    return None
