"""Find the framework ``Task`` a row names, and nothing else.

A row's ``task_path`` comes from the database, so it is never trusted. A
worker imports the module a path names only if that module is *trusted*:

1. part of an installed app (``INSTALLED_APPS``);
2. part of a distribution that provides an installed app, or that such a
   distribution requires, directly or through others (read from the installed
   packages' metadata, ``distributions.py``): Wagtail's page saves enqueue
   ``modelsearch.tasks.insert_or_update_object_task``, and the ``wagtail``
   distribution requires ``modelsearch``, which is not an app;
3. under a package listed in ``RDBTASKS_TASK_MODULES``, for the rest (a
   project package that is not an app, a library no app requires), or a
   module of ``RDBTASKS_IMPORTS``, which every worker imports at start
   (``discovery.py``);
4. or already imported by this process (a worker imports its apps, and what
   they import, at start).

The object found there must then be a framework ``Task`` whose own path is the
row's path: anything else (a function, a class, ``os.system``, an alias of a
task under another name) fails the task with ``InvalidTaskPath`` and is never
called.

Why this set. Trusted means: code the project itself chose to install and can
reach from its apps, so code it can declare and enqueue tasks from. It is
known from configuration alone, the same in every process, so a worker that
has not imported a library's task module yet still runs the library's task,
and ``enqueue()`` (``check_loadable``) can say at once what a worker would.
Not "any importable module", as django-tasks-db does (``import_string`` of the
row's path, then the ``Task`` check): that imports on the database's word
every module on ``sys.path``, the standard library and development tools
included, running whatever their import does, and runs any task they hold.
Not "modules whose ``Task`` this process has created" alone (the backend's
``validate_task`` sees each ``@task`` as it is made, ``declared_task_paths``):
a worker has created only the tasks of modules it happened to import, so it
would refuse a library's task the web process enqueued. That record still
serves: the system check ``django_rdbtasks.E012`` tests every task declared
by start-up against the rule, so ``manage.py check`` says what ``enqueue()``
would otherwise refuse in a user's request.
"""

from __future__ import annotations

import importlib
import sys
from functools import cache
from typing import Any, cast

from django.apps import apps
from django.core.signals import setting_changed
from django.dispatch import receiver

from .compat import TASK_BASE_CLASSES, Task
from .conf import IMPORTS, TASK_MODULES, project_settings
from .distributions import packages_required_by, within
from .exceptions import InvalidTaskPath

_loaded: dict[str, Task | InvalidTaskPath] = {}

#: What a path's module would be refused with, by the setting to name.
SETTING = TASK_MODULES
#: Modules every worker imports at start (discovery.py): trusted as they are.
IMPORTS_SETTING = IMPORTS


class TaskNotHere(InvalidTaskPath):
    """A well-formed path under an allowed module that this code does not have.

    The module (or the task in it) is missing, as it is from a worker of an
    older release while a newer one is rolled out: another worker may run it.
    """


@cache
def _configured_packages() -> tuple[str, ...]:
    """Rules 1 and 3: what the settings name, known without reading any metadata."""
    names = [config.name for config in apps.get_app_configs()]
    configured = project_settings()
    names += configured.task_modules
    names += configured.imports
    return tuple(names)


@cache
def _required_packages() -> frozenset[str]:
    """Rule 2, read once per process (about 50 ms for 70 distributions), when first needed."""
    return packages_required_by(config.name for config in apps.get_app_configs())


def is_trusted_module(module_name: str) -> bool:
    """Rules 1 to 3 of the module docstring: what every process of the project trusts."""
    return within(module_name, _configured_packages()) or within(module_name, _required_packages())


def _may_import(module_name: str) -> bool:
    return module_name in sys.modules or is_trusted_module(module_name)


def _untrusted(path: str, module_name: str) -> InvalidTaskPath:
    return InvalidTaskPath(
        f"{path!r}: module {module_name!r} is not part of an installed app, nor of a "
        "distribution an installed app requires, so workers do not import it "
        f"(add its package to {SETTING} to allow it)."
    )


_declared: set[str] = set()


def note_declared(path: str) -> None:
    """Record that a task at ``path`` was made in this process (the backend's ``validate_task``)."""
    _declared.add(path)


def declared_task_paths() -> frozenset[str]:
    """The paths of the tasks of this project's backends made in this process so far."""
    return frozenset(_declared)


@receiver(setting_changed)
def _forget_trust(*, setting: str, **kwargs: Any) -> None:
    """Tests change INSTALLED_APPS or the setting: what was decided from them no longer holds."""
    if setting in ("INSTALLED_APPS", SETTING, IMPORTS_SETTING):
        _configured_packages.cache_clear()
        _required_packages.cache_clear()
        _loaded.clear()
        _reachable.clear()


def _load(path: str) -> Task:
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute.isidentifier():
        raise InvalidTaskPath(f"{path!r} is not a dotted path to a task.")
    if not _may_import(module_name):
        raise _untrusted(path, module_name)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if _is_missing(exc, module_name):
            raise TaskNotHere(
                f"{path!r}: this worker's code has no module {module_name!r} ({exc})"
            ) from exc
        raise InvalidTaskPath(f"{path!r}: cannot import {module_name!r}: {exc}") from exc
    except Exception as exc:
        # A trusted module can still fail at import in its own way (Django's GIS
        # without GDAL raises ImproperlyConfigured): the row's fault, not the worker's.
        raise InvalidTaskPath(
            f"{path!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
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
    proves nothing: a worker goes by rules 1 to 3 of the module docstring (what
    it imported at start is not known here), and its ``__main__`` is
    ``manage.py``, not the script that defined the task. Cached per path: one
    import at most.
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
    if not is_trusted_module(module_name):
        return _untrusted(path, module_name)
    return None
