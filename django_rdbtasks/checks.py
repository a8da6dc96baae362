"""System checks: bad configuration fails ``manage.py check`` and worker start-up.

``register_backend_checks()`` (called from the app's ``ready()``) makes this app
the one place the task backends are checked. The framework's own
``check_tasks`` is registered only when something imports its checks module: on
Django 5.2 that is the ``django_tasks`` app, which the README does not ask for,
so without this a misconfigured backend passed ``manage.py check`` in silence.
Where the framework does register it (Django 6.1 imports it with
``django.tasks``; the backport's app on either line), each one would check every
backend again, so they are unregistered and ``check_task_backends`` runs each
backend's checks once."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from django.core import checks
from django.core.exceptions import ValidationError
from django.db import connections

from .conf import (
    IMPORT_FAILED,
    JOB_ERROR,
    JOBS_ERROR,
    PERIODIC_NOT_IMPORTED,
    settings_checks,
)

#: Modules whose ``check_tasks`` checks every backend of TASKS: Django 6.1's and the backport's.
FRAMEWORK_CHECK_MODULES = ("django.tasks.checks", "django_tasks.checks")

#: The SQLite OPTIONS that let several processes share the task database.
SQLITE_OPTIONS = (
    '{"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}'
)
#: Seconds of busy timeout below which a writer gives up too soon ("database is locked").
SQLITE_MIN_TIMEOUT = 10


def register_backend_checks() -> None:
    """Check the task backends here, and only here (see the module's docstring)."""
    for name in FRAMEWORK_CHECK_MODULES:
        try:
            # Imported now so that a later import (the backport app's ready())
            # finds the module loaded and does not register its check again.
            module = importlib.import_module(name)
        except ImportError:
            continue
        framework_check = getattr(module, "check_tasks", None)
        checks.registry.registry.registered_checks.discard(framework_check)
    checks.register(check_task_backends)


def check_task_backends(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """What the framework's ``check_tasks`` reports, plus SQLite's settings for our backends."""
    from .backend import RDBTaskBackend
    from .compat import task_backends

    messages: list[checks.CheckMessage] = []
    for backend in task_backends.all():
        messages.extend(backend.check())
        if isinstance(backend, RDBTaskBackend):
            messages.extend(sqlite_checks(backend))
            messages.extend(isolation_checks(backend))
    return messages


def sqlite_checks(backend: Any) -> list[checks.CheckMessage]:
    """W040: the backend's tasks in SQLite without WAL, IMMEDIATE and a busy timeout."""
    if backend.database not in connections:
        return []  # E001 says so
    missing = sqlite_missing(connections[backend.database].settings_dict)
    if not missing:
        return []
    return [
        checks.Warning(
            f"Task backend {backend.alias!r} keeps its tasks in SQLite (DATABASES"
            f"[{backend.database!r}]) without {', '.join(missing)}: when a worker and the "
            "process enqueuing write at once, one of them fails with 'database is locked'.",
            hint=f"Set DATABASES[{backend.database!r}]['OPTIONS'] = {SQLITE_OPTIONS}.",
            id="django_rdbtasks.W040",
        )
    ]


def sqlite_missing(settings: Mapping[str, Any]) -> list[str]:
    """What a SQLite database's settings lack for several writing processes (none if not SQLite).

    Every deployment has two processes writing at least (the one enqueuing and a
    worker), so this does not wait for ``runworkers --processes 2``. SQLite's
    default rollback journal blocks readers while a writer commits, a deferred
    transaction that reads and then writes fails at once when another wrote in
    between, and Python's default busy timeout is 5 s.
    """
    if not str(settings.get("ENGINE", "")).endswith("sqlite3"):
        return []
    name = str(settings.get("NAME", ""))
    if name == ":memory:" or "mode=memory" in name:
        return []  # one process's alone: nobody to share it with
    options = settings.get("OPTIONS") or {}
    missing = []
    init_command = str(options.get("init_command", "")).lower().replace(" ", "")
    if "journal_mode=wal" not in init_command:
        missing.append("WAL journal mode")
    if str(options.get("transaction_mode", "")).upper() not in ("IMMEDIATE", "EXCLUSIVE"):
        missing.append("IMMEDIATE transactions")
    try:
        timeout = float(options.get("timeout", 5))
    except (TypeError, ValueError):
        timeout = 0.0
    if timeout < SQLITE_MIN_TIMEOUT:
        missing.append(f"a busy timeout of {SQLITE_MIN_TIMEOUT} s or more")
    return missing


def isolation_checks(backend: Any) -> list[checks.CheckMessage]:
    """W041: the backend's tasks in MySQL/MariaDB at a level other than READ COMMITTED."""
    if backend.database not in connections:
        return []  # E001 says so
    connection = connections[backend.database]
    level = mysql_isolation_level(connection.vendor, connection.settings_dict)
    if level is None:
        return []
    return [
        checks.Warning(
            f"Task backend {backend.alias!r} keeps its tasks in MySQL/MariaDB (DATABASES"
            f"[{backend.database!r}]) at isolation level {level}, not READ COMMITTED: a "
            "workflow's settlement, made under the workflow row's lock, then reads what "
            "its transaction's snapshot saw before it waited for that lock, not what the "
            "settlement before it committed; a saga's compensations can be enqueued twice.",
            hint=(
                f"Leave DATABASES[{backend.database!r}]['OPTIONS']['isolation_level'] "
                "out (Django's default) or set it to 'read committed'."
            ),
            id="django_rdbtasks.W041",
        )
    ]


def mysql_isolation_level(vendor: str, settings: Mapping[str, Any]) -> str | None:
    """The isolation level a MySQL/MariaDB database is set to, if not READ COMMITTED.

    Django sets READ COMMITTED unless ``OPTIONS["isolation_level"]`` says
    otherwise; None there leaves the server's own (InnoDB's default is
    REPEATABLE READ). None: not MySQL/MariaDB, or READ COMMITTED.
    """
    if vendor != "mysql":
        return None
    options = settings.get("OPTIONS") or {}
    if "isolation_level" not in options:
        return None
    level = options["isolation_level"]
    if level is None:
        return "the server's default (REPEATABLE READ unless the server says otherwise)"
    if str(level).lower() == "read committed":
        return None
    return str(level).upper()


@checks.register()
def check_declared_jobs(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every declared job (RDBTASKS_JOBS, @periodic), each error by the job's name.

    One job's typo does not hide the others' errors: each job is read and
    checked on its own (``read_declared_jobs``).
    """
    from .discovery import task_module_failures
    from .job_validation import validate_job_target, validate_task_path
    from .jobs import read_declared_jobs

    task_module_failures()  # the @periodic of the tasks modules, as a worker has them
    jobs, problems = read_declared_jobs()
    errors: list[checks.CheckMessage] = [
        checks.Error(
            f"Job {name!r}: {' '.join(found)}" if name else " ".join(found),
            id=JOB_ERROR if name else JOBS_ERROR,
        )
        for name, found in problems.items()
    ]
    for name, spec in jobs.items():
        messages: list[str] = []
        for validate, arguments in (
            (spec.validate, ()),
            (validate_task_path, (spec.task_path,)),
            (validate_job_target, (spec.task_path, spec.queue_name, spec.priority)),
        ):
            try:
                validate(*arguments)
            except ValidationError as exc:
                messages += exc.messages
        if messages:
            errors.append(checks.Error(f"Job {name!r}: {'; '.join(messages)}", id=JOB_ERROR))
    return errors


@checks.register()
def check_task_modules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The modules a worker imports (discovery.py) import; what they declare is valid.

    E063: a ``tasks`` module (or one of RDBTASKS_IMPORTS) that fails to import:
    every worker would fail to start. E062: a task made with a queue its
    backend's QUEUES lacks (refused by enqueue, reported here instead of a
    traceback at import). W064: a module of the project with ``@periodic``
    that no worker imports, so its jobs would never be scheduled.
    """
    from .backend import DECLARED_OUTSIDE_QUEUES, RDBTaskBackend
    from .discovery import periodic_outside_task_modules, task_module_failures

    messages: list[checks.CheckMessage] = [
        checks.Error(
            f"Importing {module} failed: {type(exc).__name__}: {exc}",
            hint="Workers import every installed app's tasks module and RDBTASKS_IMPORTS "
            "before they start; each must import without error.",
            id=IMPORT_FAILED,
        )
        for module, exc in task_module_failures().items()
    ]
    seen = set()
    for task in list(DECLARED_OUTSIDE_QUEUES.values()):
        backend = task.get_backend()
        problem = backend.queue_problem(task) if isinstance(backend, RDBTaskBackend) else None
        if problem is not None and problem not in seen:
            seen.add(problem)
            messages.append(checks.Error(problem, id="django_rdbtasks.E062"))
    for found in periodic_outside_task_modules():
        messages.append(
            checks.Warning(
                f"{found.module} declares @periodic jobs ({', '.join(found.functions)}), but "
                "no worker imports it: they would never be scheduled.",
                hint=f"Move them into a tasks module, import {found.module} from one, or add "
                f"{found.module!r} to RDBTASKS_IMPORTS.",
                id=PERIODIC_NOT_IMPORTED,
            )
        )
    return messages


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The ``RDBTASKS_*`` settings as conf.py reads them: each problem under its setting's id.

    ``RDBTASKS_RETENTION`` (E020) above all: the schedulers prune by it on their
    own every minute, so a bare ``7`` (seconds? days?) must stop the start, not
    delete. The backends' ``OPTIONS`` are reported by each backend's ``check()``.
    """
    return settings_checks()


@checks.register(checks.Tags.models)
def check_foreign_keys_to_tasks(
    app_configs: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """A foreign key to Task with a constraint in a PostgreSQL task database.

    There a task's row moves to the table of finished rows as it finishes
    (db/postgresql/finished.py). A constraint does not follow it: the move of a task
    some row refers to would fail, every time, and the task would never be
    recorded finished.
    """
    from django.apps import apps

    from .backend import RDBTaskBackend
    from .compat import task_backends
    from .models import Task

    databases = {
        backend.database
        for backend in task_backends.all()
        if isinstance(backend, RDBTaskBackend)
        and backend.database in connections
        and connections[backend.database].vendor == "postgresql"
    }
    if not databases:
        return []
    # The through tables of many-to-many fields too: each is a foreign key.
    if app_configs is None:
        models = apps.get_models(include_auto_created=True)
    else:
        models = [
            model
            for config in app_configs
            for model in config.get_models(include_auto_created=True)
        ]
    return [
        checks.Error(
            f"{model._meta.label}.{field.name} is a foreign key to django_rdbtasks.Task with a "
            "database constraint: on PostgreSQL a finished task's row moves to a table the "
            "constraint does not follow, and such a task could never be recorded finished.",
            hint="Declare it with db_constraint=False (Django still cascades deletions).",
            obj=field,
            id="django_rdbtasks.E032",
        )
        for model in models
        if model._meta.app_label != "django_rdbtasks"
        for field in model._meta.concrete_fields
        if field.is_relation
        and field.related_model is not None
        and field.related_model._meta.concrete_model is Task  # a proxy's rows too
        and getattr(field, "db_constraint", False)
    ]


# -- Tasks no worker would load (issue 44) ---------------------------------------------


@checks.register()
def check_declared_tasks(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E012: a task of this backend declared in a module no worker would import.

    ``enqueue()`` refuses such a task every time (``loading.check_loadable``);
    said here, by ``manage.py check`` and ``runworkers`` at start, a deploy
    stops instead of a user's request failing. Only the tasks made by the time
    the checks run are known: those of modules imported at start-up (apps,
    models, URLs); a module imported later is checked at its first enqueue.
    """
    from .exceptions import InvalidTaskPath
    from .loading import SETTING, check_loadable, declared_task_paths, is_trusted_module

    errors: list[checks.CheckMessage] = []
    for path in sorted(declared_task_paths()):
        try:
            check_loadable(path)
        except InvalidTaskPath as exc:
            module = path.rpartition(".")[0]
            if module == "__main__" or module.startswith("__main__."):
                hint = "Declare it in a module of an installed app."
            elif not is_trusted_module(module):
                hint = (
                    f"Move it into an installed app, or add {module!r} (or a package above "
                    f"it) to {SETTING}."
                )
            else:  # task()(function) bound to another name: the path finds the function
                hint = (
                    "A worker finds a task by its function's name in its module: put @task() "
                    "on the function itself."
                )
            errors.append(
                checks.Error(
                    f"Task {path!r} cannot be enqueued: {exc}",
                    hint=hint,
                    id="django_rdbtasks.E012",
                )
            )
    return errors
