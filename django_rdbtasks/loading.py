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
    if module_name in sys.modules:
        return True
    return any(
        module_name == prefix or module_name.startswith(prefix + ".")
        for prefix in _allowed_prefixes()
    )


def _load(path: str) -> Task:
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute.isidentifier():
        raise InvalidTaskPath(f"{path!r} is not a dotted path to a task.")
    if not _may_import(module_name):
        raise InvalidTaskPath(
            f"{path!r}: module {module_name!r} is not part of an installed app "
            "(add its package to RDBTASKS_TASK_MODULES to allow it)."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if _is_missing(exc, module_name):
            raise TaskNotHere(
                f"{path!r}: this worker's code has no module {module_name!r} ({exc})"
            ) from exc
        raise InvalidTaskPath(f"{path!r}: cannot import {module_name!r}: {exc}") from exc
    if not hasattr(module, attribute):
        raise TaskNotHere(f"{path!r}: this worker's code has no {attribute!r} in {module_name!r}")
    found = getattr(module, attribute, None)
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
