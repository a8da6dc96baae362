"""The app's settings, typed and checked once: each task backend's ``OPTIONS`` and ``RDBTASKS_*``.

Everything else reads these objects, never ``settings.RDBTASKS_*`` or a
backend's raw ``options`` dict, so that each value is parsed in one place, with
one message for what is wrong with it.

- ``BackendOptions`` is the ``OPTIONS`` of one ``TASKS`` entry: the backend
  reads it once, in its ``__init__`` (the framework makes a new backend when
  ``TASKS`` changes, so it follows ``override_settings`` by itself).
- ``ProjectSettings`` is the ``RDBTASKS_*`` settings: ``project_settings()``
  reads them once and keeps the result until a ``setting_changed`` signal
  names one of them, as Django's own cached settings do.

A bad value never raises while it is read: ``manage.py check`` must be able to
say what is wrong (a backend made at import would otherwise end every command
in a traceback). It is replaced by its default and recorded as a ``Problem``
carrying the id of the system check that reports it (checks.py, and the
backend's ``check()``). What acts on a value that must not be guessed (pruning
by the retention, the admin's permissions) calls ``ProjectSettings.require``,
which raises ``ImproperlyConfigured`` with the problems of that setting.

The README's "Settings reference" table lists exactly the fields below that
carry a setting name (``tests/test_conf.py`` compares them).
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from .durations import parse_age
from .limits import Limit, queue_limits_option
from .states import TaskStatus
from .storable import (
    DEFAULT_MAX_ARGUMENTS_BYTES,
    DEFAULT_MAX_CHECKPOINT_BYTES,
    DEFAULT_MAX_ERROR_BYTES,
    DEFAULT_MAX_RESULT_BYTES,
    StorageLimits,
)
from .suggest import did_you_mean

#: The names of the ``RDBTASKS_*`` settings, for the modules that name one in a message.
TASK_MODULES = "RDBTASKS_TASK_MODULES"
IMPORTS = "RDBTASKS_IMPORTS"
JOBS = "RDBTASKS_JOBS"
MISFIRE_GRACE = "RDBTASKS_MISFIRE_GRACE"
HTTP_ALLOWED_HOSTS = "RDBTASKS_HTTP_ALLOWED_HOSTS"
RETENTION = "RDBTASKS_RETENTION"
HEALTH = "RDBTASKS_HEALTH"
RETIRE_AFTER = "RDBTASKS_RETIRE_AFTER"
METRICS_TOKEN = "RDBTASKS_METRICS_TOKEN"
QUEUE_PERMISSIONS = "RDBTASKS_QUEUE_PERMISSIONS"

#: The system check ids of the settings (README, "Settings reference").
OPTION_ERROR = "django_rdbtasks.E003"
DATABASE_MISSING = "django_rdbtasks.E001"
LISTEN_DATABASE_MISSING = "django_rdbtasks.E030"
READ_DATABASE_MISSING = "django_rdbtasks.E050"
JOB_ERROR = "django_rdbtasks.E011"
IMPORT_FAILED = "django_rdbtasks.E063"
PERIODIC_NOT_IMPORTED = "django_rdbtasks.W064"
UNKNOWN_OPTION = "django_rdbtasks.W001"
JOBS_ERROR = "django_rdbtasks.E010"
RETENTION_ERROR = "django_rdbtasks.E020"
TASK_MODULES_ERROR = "django_rdbtasks.E071"
IMPORTS_ERROR = "django_rdbtasks.E072"
MISFIRE_GRACE_ERROR = "django_rdbtasks.E073"
HTTP_ALLOWED_HOSTS_ERROR = "django_rdbtasks.E074"
HEALTH_ERROR = "django_rdbtasks.E075"
RETIRE_AFTER_ERROR = "django_rdbtasks.E076"
RETIRE_AFTER_RAISED = "django_rdbtasks.W076"
METRICS_TOKEN_ERROR = "django_rdbtasks.E077"
QUEUE_PERMISSIONS_ERROR = "django_rdbtasks.E078"

#: Under this, an error's or a checkpoint's limit would leave too little to read.
MIN_STORAGE_LIMIT = 1024

#: How late a tick may fire under the "skip" policy before it counts as missed.
DEFAULT_MISFIRE_GRACE = 60.0
#: How often every scheduler re-declares the jobs in its code, in seconds.
DECLARE_EVERY = 60.0
#: Default of ``RDBTASKS_RETIRE_AFTER``: a code job no live scheduler declared
#: for this long is retired. Several re-declare intervals, so a scheduler that
#: is slow, restarting or briefly cut off from the database retires nothing.
DEFAULT_RETIRE_AFTER = 600.0
#: The least retirement window accepted: below it a merely late re-declaration
#: would retire a job that is still declared.
MIN_RETIRE_AFTER = 3 * DECLARE_EVERY

#: Setting names of ``RDBTASKS_HEALTH`` and what each limits.
HEALTH_LIMITS = {
    "MAX_LAG": "seconds the oldest runnable task may wait",
    "MIN_WORKERS": "live workers there must be",
    "MAX_READY": "runnable tasks there may be (queue depth)",
    "MAX_STALLED": "running tasks whose worker stopped renewing their lease",
    "MAX_FAILED": "tasks that may fail for good in the window (an hour)",
    "MAX_XMIN_AGE": "seconds the oldest open transaction or snapshot of the task database "
    "may hold back the cleanup of dead rows (see docs/admin.md)",
}


@dataclass(frozen=True, slots=True)
class Problem:
    """What is wrong with one setting's value, and the system check that says so."""

    #: The setting as the project writes it: ``RDBTASKS_RETENTION``, ``MAX_ATTEMPTS``.
    setting: str
    message: str
    check_id: str
    hint: str = ""

    @property
    def is_warning(self) -> bool:
        return ".W" in self.check_id

    def as_check(self, prefix: str = "") -> checks.CheckMessage:
        kind = checks.Warning if self.is_warning else checks.Error
        return kind(prefix + self.message, hint=self.hint or None, id=self.check_id)


def setting(name: str, default: Any, checks: tuple[str, ...], *, shown: str | None = None) -> Any:
    """A field read from the setting ``name``: the ids of the system checks that report a bad
    value of it, and ``shown``, its default as the README writes it (else ``str(default)``)."""
    metadata = {"setting": name, "checks": checks, "shown": shown}
    if isinstance(default, Mapping):
        frozen = MappingProxyType(dict(default))
        return field(default_factory=lambda: frozen, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, slots=True)
class SettingField:
    """One field read from a setting, as the README's "Settings reference" lists it."""

    field: str
    setting: str
    default: Any
    shown: str
    checks: tuple[str, ...]


def setting_fields(cls: type) -> list[SettingField]:
    """The fields of ``cls`` read from a setting, in order."""
    found = []
    for each in fields(cls):
        if "setting" not in each.metadata:
            continue
        factory: Any = each.default_factory
        default = factory() if callable(factory) else each.default
        shown = each.metadata["shown"] or str(default)
        found.append(
            SettingField(
                each.name, each.metadata["setting"], default, shown, each.metadata["checks"]
            )
        )
    return found


# -- parsing one value ---------------------------------------------------------------------


class Reader:
    """Reads raw values into typed ones; a bad one is its default, and a problem recorded."""

    def __init__(self, raw: Mapping[str, Any], *, label: Callable[[str], str]) -> None:
        self.raw = raw
        self.label = label
        self.problems: list[Problem] = []

    def problem(self, name: str, message: str, check_id: str, hint: str = "") -> None:
        self.problems.append(Problem(name, message, check_id, hint))

    def number(
        self, name: str, default: float, check_id: str, *, minimum: float, whole: bool = False
    ) -> Any:
        """A number of at least ``minimum``; text is accepted (settings often come from the
        environment), ``True`` is not."""
        raw = self.raw.get(name, default)
        kind: type = int if whole else float
        try:
            value = kind(raw)
            valid = not isinstance(raw, bool) and value >= minimum and float(raw) == value
        except (TypeError, ValueError, OverflowError):
            valid = False
        if not valid:
            what = "a whole number" if whole else "a number"
            self.problem(
                name,
                f"{self.label(name)} must be {what} of at least {minimum}, not {raw!r}.",
                check_id,
            )
            return default
        return value

    def seconds(self, name: str, default: float, check_id: str) -> float:
        """Seconds, 0 or more: a number (or numeric text) or a ``timedelta``."""
        raw = self.raw.get(name, default)
        if isinstance(raw, dt.timedelta):
            if raw >= dt.timedelta(0):
                return raw.total_seconds()
            self.problem(
                name, f"{self.label(name)} must be 0 seconds or more, not {raw!r}.", check_id
            )
            return default
        return float(self.number(name, default, check_id, minimum=0))

    def boolean(self, name: str, default: bool, check_id: str) -> bool:
        raw = self.raw.get(name, default)
        if isinstance(raw, bool):
            return raw
        self.problem(name, f"{self.label(name)} must be True or False, not {raw!r}.", check_id)
        return default

    def alias(self, name: str, default: str | None, check_id: str) -> str | None:
        """A database alias (whether DATABASES has it is the checks' to say: E001, E030, E050)."""
        raw = self.raw.get(name, default)
        if raw is None or isinstance(raw, str):
            return raw
        self.problem(
            name, f"{self.label(name)} must be a database alias (text), not {raw!r}.", check_id
        )
        return default

    def names(self, name: str, check_id: str, what: str) -> tuple[str, ...]:
        """A list of names; ``None`` is none. One string is refused: it is not a list of its
        letters."""
        raw = self.raw.get(name)
        if raw is None:
            return ()
        if isinstance(raw, Iterable) and not isinstance(raw, str | bytes | Mapping):
            values = tuple(raw)  # once: an iterator would be spent by the check
            if all(isinstance(each, str) and each for each in values):
                return values
        self.problem(name, f"{self.label(name)} must be a list of {what}, not {raw!r}.", check_id)
        return ()


# -- a task backend's OPTIONS --------------------------------------------------------------


@dataclass(frozen=True)
class BackendOptions:
    """The ``OPTIONS`` of one ``TASKS`` entry (this app's backend), typed, with their defaults."""

    database: str = setting(
        "DATABASE", "default", (OPTION_ERROR, DATABASE_MISSING), shown='`"default"`'
    )
    max_attempts: int = setting("MAX_ATTEMPTS", 3, (OPTION_ERROR,))
    backoff: float = setting("BACKOFF", 1.0, (OPTION_ERROR,))
    max_backoff: float = setting("MAX_BACKOFF", 3600.0, (OPTION_ERROR,), shown="3600")
    notify: bool = setting("NOTIFY", True, (OPTION_ERROR,), shown="`True`")
    progress_interval: float = setting("PROGRESS_INTERVAL", 1.0, (OPTION_ERROR,))
    timeout_grace: float = setting("TIMEOUT_GRACE", 5.0, (OPTION_ERROR,))
    #: Seconds (the setting may be a ``timedelta``).
    missing_task_grace: float = setting("MISSING_TASK_GRACE", 600.0, (OPTION_ERROR,), shown="600")
    transaction_pooling: bool = setting(
        "TRANSACTION_POOLING", False, (OPTION_ERROR,), shown="`False`"
    )
    queue_limits: Mapping[str, Limit] = setting("QUEUE_LIMITS", {}, (OPTION_ERROR,), shown="`{}`")
    #: None: the task database itself, or none at all behind a transaction pooler.
    listen_database: str | None = setting(
        "LISTEN_DATABASE",
        None,
        (OPTION_ERROR, LISTEN_DATABASE_MISSING),
        shown="the task database, or none when pooled",
    )
    max_arguments_bytes: int = setting(
        "MAX_ARGUMENTS_BYTES", DEFAULT_MAX_ARGUMENTS_BYTES, (OPTION_ERROR,)
    )
    max_result_bytes: int = setting("MAX_RESULT_BYTES", DEFAULT_MAX_RESULT_BYTES, (OPTION_ERROR,))
    max_error_bytes: int = setting("MAX_ERROR_BYTES", DEFAULT_MAX_ERROR_BYTES, (OPTION_ERROR,))
    max_checkpoint_bytes: int = setting(
        "MAX_CHECKPOINT_BYTES", DEFAULT_MAX_CHECKPOINT_BYTES, (OPTION_ERROR,)
    )
    #: None: the task database (reads.py).
    read_database: str | None = setting(
        "READ_DATABASE",
        None,
        (OPTION_ERROR, READ_DATABASE_MISSING),
        shown="none (the task database)",
    )
    #: What is wrong with the ``OPTIONS`` (each bad value above is its default).
    problems: tuple[Problem, ...] = field(default=(), compare=False)

    @property
    def errors(self) -> list[str]:
        """The problems an enqueue refuses to go on with (unknown keys are only warned of)."""
        return [problem.message for problem in self.problems if not problem.is_warning]

    @property
    def storage_limits(self) -> StorageLimits:
        return StorageLimits(
            arguments=self.max_arguments_bytes,
            result=self.max_result_bytes,
            error=self.max_error_bytes,
            checkpoint=self.max_checkpoint_bytes,
        )


#: The ``OPTIONS`` keys this app's backend reads.
KNOWN_OPTIONS = frozenset(each.setting for each in setting_fields(BackendOptions))


def read_backend_options(raw: object) -> BackendOptions:
    """``OPTIONS`` as given (a dict, numbers possibly as text), typed; bad values as problems."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        return BackendOptions(
            problems=(Problem("OPTIONS", f"OPTIONS must be a dict, not {raw!r}.", OPTION_ERROR),)
        )
    read = Reader(raw, label=lambda name: f"OPTIONS[{name!r}]")
    defaults = BackendOptions()
    database = read.alias("DATABASE", defaults.database, OPTION_ERROR)
    if database is None:
        read.problem(
            "DATABASE", "OPTIONS['DATABASE'] must be a database alias, not None.", OPTION_ERROR
        )
        database = defaults.database
    options: dict[str, Any] = {
        "database": database,
        "max_attempts": read.number(
            "MAX_ATTEMPTS", defaults.max_attempts, OPTION_ERROR, minimum=1, whole=True
        ),
        "backoff": read.number("BACKOFF", defaults.backoff, OPTION_ERROR, minimum=0),
        "max_backoff": read.number("MAX_BACKOFF", defaults.max_backoff, OPTION_ERROR, minimum=0),
        "notify": read.boolean("NOTIFY", defaults.notify, OPTION_ERROR),
        "progress_interval": read.seconds(
            "PROGRESS_INTERVAL", defaults.progress_interval, OPTION_ERROR
        ),
        "timeout_grace": read.seconds("TIMEOUT_GRACE", defaults.timeout_grace, OPTION_ERROR),
        "missing_task_grace": read.seconds(
            "MISSING_TASK_GRACE", defaults.missing_task_grace, OPTION_ERROR
        ),
        "transaction_pooling": read.boolean(
            "TRANSACTION_POOLING", defaults.transaction_pooling, OPTION_ERROR
        ),
        "listen_database": read.alias("LISTEN_DATABASE", None, OPTION_ERROR),
        "read_database": read.alias("READ_DATABASE", None, OPTION_ERROR),
    }
    for each in setting_fields(BackendOptions):
        if each.setting.endswith("_BYTES"):
            options[each.field] = read.number(
                each.setting, each.default, OPTION_ERROR, minimum=MIN_STORAGE_LIMIT, whole=True
            )
    limits, errors = queue_limits_option(raw.get("QUEUE_LIMITS"))
    options["queue_limits"] = MappingProxyType(limits)
    for message in errors:
        read.problem("QUEUE_LIMITS", message, OPTION_ERROR)
    unknown = sorted(str(key) for key in set(raw) - KNOWN_OPTIONS)
    if unknown:
        read.problem(
            ", ".join(unknown),
            f"unknown OPTIONS {', '.join(unknown)}."
            + "".join(did_you_mean(name, KNOWN_OPTIONS) for name in unknown[:1]),
            UNKNOWN_OPTION,
            hint=f"Known: {', '.join(sorted(KNOWN_OPTIONS))}.",
        )
    return BackendOptions(**options, problems=tuple(read.problems))


# -- the RDBTASKS_* settings ---------------------------------------------------------------


@dataclass(frozen=True)
class ProjectSettings:
    """The ``RDBTASKS_*`` settings, typed, with their defaults."""

    task_modules: tuple[str, ...] = setting(TASK_MODULES, (), (TASK_MODULES_ERROR,), shown="`[]`")
    imports: tuple[str, ...] = setting(
        IMPORTS, (), (IMPORTS_ERROR, IMPORT_FAILED, PERIODIC_NOT_IMPORTED), shown="`[]`"
    )
    #: Job name to its entry; each entry is read and checked by jobs.py (E011).
    jobs: Mapping[str, Any] = setting(JOBS, {}, (JOBS_ERROR, JOB_ERROR), shown="`{}`")
    misfire_grace: float = setting(
        MISFIRE_GRACE, DEFAULT_MISFIRE_GRACE, (MISFIRE_GRACE_ERROR,), shown="60"
    )
    http_allowed_hosts: tuple[str, ...] = setting(
        HTTP_ALLOWED_HOSTS, (), (HTTP_ALLOWED_HOSTS_ERROR,), shown="`[]`"
    )
    retention: Mapping[str, dt.timedelta] = setting(RETENTION, {}, (RETENTION_ERROR,), shown="`{}`")
    #: Upper-case limit name to its value.
    health: Mapping[str, float] = setting(HEALTH, {}, (HEALTH_ERROR,), shown="`{}`")
    #: Never below ``MIN_RETIRE_AFTER`` (a warning says when it was raised).
    retire_after: float = setting(
        RETIRE_AFTER, DEFAULT_RETIRE_AFTER, (RETIRE_AFTER_ERROR, RETIRE_AFTER_RAISED), shown="600"
    )
    metrics_token: str = setting(METRICS_TOKEN, "", (METRICS_TOKEN_ERROR,), shown="unset")
    #: Queue name (``*``: every other queue) to the groups that may see it.
    queue_permissions: Mapping[str, frozenset[str]] = setting(
        QUEUE_PERMISSIONS, {}, (QUEUE_PERMISSIONS_ERROR,), shown="`{}`"
    )
    problems: tuple[Problem, ...] = field(default=(), compare=False)

    def problems_of(self, setting_name: str, *, warnings: bool = False) -> list[Problem]:
        return [
            problem
            for problem in self.problems
            if problem.setting == setting_name and (warnings or not problem.is_warning)
        ]

    def require(self, setting_name: str) -> None:
        """Raise ``ImproperlyConfigured`` naming the problems of ``setting_name``, if any."""
        problems = self.problems_of(setting_name)
        if problems:
            raise ImproperlyConfigured(" ".join(problem.message for problem in problems))


#: The settings ``ProjectSettings`` reads.
PROJECT_SETTINGS = tuple(each.setting for each in setting_fields(ProjectSettings))


def read_project_settings(raw: Mapping[str, Any]) -> ProjectSettings:
    """The ``RDBTASKS_*`` settings of ``raw`` (setting name to value; absent: the default)."""
    read = Reader(raw, label=str)
    values: dict[str, Any] = {
        "task_modules": read.names(TASK_MODULES, TASK_MODULES_ERROR, "package names"),
        "imports": read.names(IMPORTS, IMPORTS_ERROR, "module names"),
        "jobs": _jobs(read),
        "misfire_grace": read.number(
            MISFIRE_GRACE, DEFAULT_MISFIRE_GRACE, MISFIRE_GRACE_ERROR, minimum=0
        ),
        "http_allowed_hosts": read.names(
            HTTP_ALLOWED_HOSTS, HTTP_ALLOWED_HOSTS_ERROR, "host patterns"
        ),
        "retention": _retention(read),
        "health": _health(read),
        "retire_after": _retire_after(read),
        "metrics_token": _metrics_token(read),
        "queue_permissions": _queue_permissions(read),
    }
    return ProjectSettings(**values, problems=tuple(read.problems))


def _jobs(read: Reader) -> Mapping[str, Any]:
    name = JOBS
    raw = read.raw.get(name) or {}
    if not isinstance(raw, Mapping):
        read.problem(name, f"{name} must be a dict of job name to job, not {raw!r}.", JOBS_ERROR)
        return MappingProxyType({})
    return MappingProxyType(dict(raw))


def _retention(read: Reader) -> Mapping[str, dt.timedelta]:
    name = RETENTION
    hint = 'Ages carry a unit: {"SUCCESSFUL": "7d", "FAILED": "30d"}, or a timedelta.'
    raw = read.raw.get(name)
    if not raw:
        return MappingProxyType({})
    if not isinstance(raw, Mapping):
        read.problem(
            name,
            f"{name} must be a dict of status to age, like "
            f'{{"SUCCESSFUL": "7d", "FAILED": "30d"}}, not {raw!r}.',
            RETENTION_ERROR,
            hint,
        )
        return MappingProxyType({})
    finished = TaskStatus.finished()
    ages: dict[str, dt.timedelta] = {}
    for status, age in raw.items():
        if status not in finished:
            read.problem(
                name,
                f"{name}: {status!r} is not a finished status "
                f"({', '.join(finished)}); only finished tasks can be pruned.",
                RETENTION_ERROR,
                hint,
            )
            continue
        try:
            ages[status] = parse_age(age)
        except ValueError as exc:
            read.problem(name, f"{name}[{status!r}]: {exc}", RETENTION_ERROR, hint)
    return MappingProxyType(ages)


def _health(read: Reader) -> Mapping[str, float]:
    name = HEALTH
    raw = read.raw.get(name) or {}
    if not isinstance(raw, Mapping):
        read.problem(
            name, f"{name} must be a dict of limit name to number, not {raw!r}.", HEALTH_ERROR
        )
        return MappingProxyType({})
    limits = {str(key).upper(): value for key, value in raw.items()}
    for key in sorted(set(limits) - set(HEALTH_LIMITS)):
        read.problem(
            name, f"{name}: unknown key {key!r}." + did_you_mean(key, HEALTH_LIMITS), HEALTH_ERROR
        )
    numbers: dict[str, float] = {}
    for key, value in limits.items():
        if value is None or key not in HEALTH_LIMITS:
            continue
        try:
            number = float(value)
            valid = not isinstance(value, bool) and not math.isnan(number)
        except (TypeError, ValueError):
            valid = False
        if valid:
            numbers[key] = number
        else:
            read.problem(name, f"{name}[{key!r}] must be a number, not {value!r}.", HEALTH_ERROR)
    return MappingProxyType(numbers)


def _retire_after(read: Reader) -> float:
    name = RETIRE_AFTER
    raw = read.raw.get(name, DEFAULT_RETIRE_AFTER)
    try:
        seconds = float(raw)
        valid = not isinstance(raw, bool) and not math.isnan(seconds)
    except (TypeError, ValueError):
        valid = False
    if not valid:
        read.problem(name, f"{name} must be a number of seconds, not {raw!r}.", RETIRE_AFTER_ERROR)
        return DEFAULT_RETIRE_AFTER
    if seconds < MIN_RETIRE_AFTER:
        read.problem(
            name,
            f"{name}={raw} is below {int(MIN_RETIRE_AFTER)}s (three re-declare intervals); "
            f"using {int(MIN_RETIRE_AFTER)}s.",
            RETIRE_AFTER_RAISED,
            hint="A merely late re-declaration would retire a job that is still declared.",
        )
        return MIN_RETIRE_AFTER
    return seconds


def _metrics_token(read: Reader) -> str:
    name = METRICS_TOKEN
    raw = read.raw.get(name)
    if raw is None:
        return ""
    if not isinstance(raw, str):
        read.problem(name, f"{name} must be text, not {type(raw).__name__}.", METRICS_TOKEN_ERROR)
        return ""
    return raw


def _queue_permissions(read: Reader) -> Mapping[str, frozenset[str]]:
    name = QUEUE_PERMISSIONS
    raw = read.raw.get(name) or {}
    if not isinstance(raw, Mapping):
        read.problem(
            name, f"{name} must be a dict of queue name to group names.", QUEUE_PERMISSIONS_ERROR
        )
        return MappingProxyType({})
    groups: dict[str, frozenset[str]] = {}
    for queue, names in raw.items():
        if isinstance(names, str) or not isinstance(names, Iterable):
            read.problem(
                name, f"{name}[{queue!r}] must be a list of group names.", QUEUE_PERMISSIONS_ERROR
            )
            continue
        groups[str(queue)] = frozenset(str(each) for each in names)
    return MappingProxyType(groups)


# -- read once -------------------------------------------------------------------------------


@functools.cache
def project_settings() -> ProjectSettings:
    """The ``RDBTASKS_*`` settings of this process, read at the first call after a change."""
    return read_project_settings(
        {
            name: getattr(django_settings, name)
            for name in PROJECT_SETTINGS
            if hasattr(django_settings, name)
        }
    )


@receiver(setting_changed)
def forget_project_settings(*, setting: str, **kwargs: Any) -> None:
    """``override_settings`` (and pytest-django's ``settings``) changed one of ours."""
    if setting in PROJECT_SETTINGS:
        project_settings.cache_clear()


def settings_checks() -> list[checks.CheckMessage]:
    """The problems of the ``RDBTASKS_*`` settings, each with its check id (checks.py)."""
    return [problem.as_check() for problem in project_settings().problems]
