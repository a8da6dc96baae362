"""conf.py: the backend's OPTIONS and the RDBTASKS_* settings, typed, checked, read once.

The parsing tests are pure (no database, no Django settings); then the cache
against ``override_settings``, the system checks, the README's table, and a
walk over the package that finds no other reader of the raw settings.
"""

from __future__ import annotations

import ast
import datetime as dt
import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

import django_rdbtasks
from django_rdbtasks.checks import check_settings
from django_rdbtasks.conf import (
    KNOWN_OPTIONS,
    MIN_RETIRE_AFTER,
    PROJECT_SETTINGS,
    BackendOptions,
    ProjectSettings,
    project_settings,
    read_backend_options,
    read_project_settings,
    setting_fields,
)
from django_rdbtasks.limits import ConcurrencyLimit
from django_rdbtasks.storable import StorageLimits

PACKAGE = Path(django_rdbtasks.__file__).resolve().parent
README = PACKAGE.parent / "README.md"
DAY = dt.timedelta(days=1)


def only_problem(found: BackendOptions | ProjectSettings) -> Any:
    [problem] = found.problems
    return problem


# -- a backend's OPTIONS -------------------------------------------------------------------


def test_no_options_are_the_defaults_as_they_always_were() -> None:
    options = read_backend_options({})
    assert options == BackendOptions()
    assert options.problems == ()
    assert (options.database, options.max_attempts, options.backoff, options.max_backoff) == (
        "default",
        3,
        1.0,
        3600.0,
    )
    assert (options.notify, options.transaction_pooling) == (True, False)
    assert (options.progress_interval, options.timeout_grace) == (1.0, 5.0)
    assert options.missing_task_grace == 600.0
    assert (options.listen_database, options.read_database) == (None, None)
    assert dict(options.queue_limits) == {}
    assert options.storage_limits == StorageLimits()
    assert read_backend_options(None) == BackendOptions()


def test_numbers_may_be_text_and_a_grace_a_timedelta() -> None:
    options = read_backend_options(
        {
            "MAX_ATTEMPTS": "5",
            "BACKOFF": "0.5",
            "PROGRESS_INTERVAL": 0,
            "MISSING_TASK_GRACE": dt.timedelta(minutes=2),
            "TIMEOUT_GRACE": "45",
            "MAX_RESULT_BYTES": "2048",
            "QUEUE_LIMITS": {"emails": ConcurrencyLimit(2)},
            "LISTEN_DATABASE": "direct",
            "NOTIFY": False,
        }
    )
    assert options.problems == ()
    assert (options.max_attempts, options.backoff, options.progress_interval) == (5, 0.5, 0.0)
    assert (options.missing_task_grace, options.timeout_grace) == (120.0, 45.0)
    assert options.storage_limits.result == 2048
    assert options.queue_limits == {"emails": ConcurrencyLimit(2)}
    assert (options.listen_database, options.notify) == ("direct", False)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("MAX_ATTEMPTS", 0, "OPTIONS['MAX_ATTEMPTS'] must be a whole number of at least 1, not 0."),
        ("MAX_ATTEMPTS", 2.5, "must be a whole number of at least 1, not 2.5."),
        ("MAX_ATTEMPTS", True, "must be a whole number of at least 1, not True."),
        ("BACKOFF", "nan", "OPTIONS['BACKOFF'] must be a number of at least 0, not 'nan'."),
        ("PROGRESS_INTERVAL", "often", "OPTIONS['PROGRESS_INTERVAL'] must be a number"),
        ("TIMEOUT_GRACE", -1, "OPTIONS['TIMEOUT_GRACE'] must be a number of at least 0, not -1."),
        ("MISSING_TASK_GRACE", dt.timedelta(seconds=-1), "must be 0 seconds or more"),
        ("MISSING_TASK_GRACE", "soon", "OPTIONS['MISSING_TASK_GRACE'] must be a number"),
        ("NOTIFY", "false", "OPTIONS['NOTIFY'] must be True or False, not 'false'."),
        ("TRANSACTION_POOLING", 1, "OPTIONS['TRANSACTION_POOLING'] must be True or False, not 1."),
        ("DATABASE", None, "OPTIONS['DATABASE'] must be a database alias, not None."),
        ("READ_DATABASE", 5, "OPTIONS['READ_DATABASE'] must be a database alias (text), not 5."),
        ("MAX_ERROR_BYTES", 10, "must be a whole number of at least 1024, not 10."),
        ("QUEUE_LIMITS", ["emails"], "OPTIONS['QUEUE_LIMITS'] must map queue names to limits."),
    ],
)
def test_a_bad_option_is_its_default_and_a_problem_naming_it(
    name: str, value: Any, message: str
) -> None:
    options = read_backend_options({name: value})
    problem = only_problem(options)
    assert message in problem.message
    assert problem.setting == name and problem.check_id == "django_rdbtasks.E003"
    assert options.errors == [problem.message]
    assert options == BackendOptions()  # every value its default


def test_unknown_options_are_a_warning_with_the_option_meant() -> None:
    options = read_backend_options({"MAX_ATEMPTS": 3, "NOTIFY": False})
    problem = only_problem(options)
    assert problem.check_id == "django_rdbtasks.W001" and problem.is_warning
    assert "unknown OPTIONS MAX_ATEMPTS" in problem.message
    assert "Did you mean 'MAX_ATTEMPTS'" in problem.message
    assert options.errors == []  # enqueue goes on
    assert not options.notify  # the known ones are read all the same


def test_options_that_are_not_a_dict() -> None:
    problem = only_problem(read_backend_options(["DATABASE"]))
    assert problem.message == "OPTIONS must be a dict, not ['DATABASE']."


# -- the RDBTASKS_* settings ---------------------------------------------------------------


def test_no_settings_are_the_defaults_as_they_always_were() -> None:
    found = read_project_settings({})
    assert found == ProjectSettings() and found.problems == ()
    assert (found.misfire_grace, found.retire_after, found.metrics_token) == (60.0, 600.0, "")
    assert found.task_modules == found.imports == found.http_allowed_hosts == ()
    assert dict(found.jobs) == dict(found.retention) == dict(found.health) == {}
    assert dict(found.queue_permissions) == {}
    # None is "not set", as getattr(settings, name, None) or {} read it.
    assert read_project_settings(dict.fromkeys(PROJECT_SETTINGS)) == ProjectSettings()


def test_settings_read_into_their_types() -> None:
    found = read_project_settings(
        {
            "RDBTASKS_TASK_MODULES": ["plugins"],
            "RDBTASKS_IMPORTS": ("myapp.jobs",),
            "RDBTASKS_MISFIRE_GRACE": "30",
            "RDBTASKS_HTTP_ALLOWED_HOSTS": ["*.example.com"],
            "RDBTASKS_RETENTION": {"SUCCESSFUL": "7d", "FAILED": dt.timedelta(days=30)},
            "RDBTASKS_HEALTH": {"max_lag": "60", "MIN_WORKERS": 2, "MAX_READY": None},
            "RDBTASKS_RETIRE_AFTER": 1800,
            "RDBTASKS_METRICS_TOKEN": "s3cret",
            "RDBTASKS_QUEUE_PERMISSIONS": {"emails": ["mailing"], "*": ("ops",)},
        }
    )
    assert found.problems == ()
    assert (found.task_modules, found.imports) == (("plugins",), ("myapp.jobs",))
    assert (found.misfire_grace, found.retire_after, found.metrics_token) == (
        30.0,
        1800.0,
        "s3cret",
    )
    assert found.http_allowed_hosts == ("*.example.com",)
    assert found.retention == {"SUCCESSFUL": 7 * DAY, "FAILED": 30 * DAY}
    assert found.health == {"MAX_LAG": 60.0, "MIN_WORKERS": 2.0}
    assert found.queue_permissions == {"emails": {"mailing"}, "*": {"ops"}}


def test_retention_reports_every_bad_entry() -> None:
    found = read_project_settings(
        {"RDBTASKS_RETENTION": {"SUCCESSFUL": 7, "FAILED": "30d", "READY": "1d"}}
    )
    assert found.retention == {"FAILED": 30 * DAY}
    first, second = found.problems
    assert "RDBTASKS_RETENTION['SUCCESSFUL']: 7 has no unit" in first.message
    assert "'READY' is not a finished status" in second.message
    assert {first.check_id, second.check_id} == {"django_rdbtasks.E020"}
    assert first.hint.startswith("Ages carry a unit")
    with pytest.raises(ImproperlyConfigured, match=r"7 has no unit.*'READY' is not"):
        found.require("RDBTASKS_RETENTION")


def test_health_names_unknown_keys_and_values_that_are_not_numbers() -> None:
    found = read_project_settings({"RDBTASKS_HEALTH": {"MAX_LAGG": 60, "MIN_WORKERS": "many"}})
    messages = [problem.message for problem in found.problems]
    assert messages[0].startswith("RDBTASKS_HEALTH: unknown key 'MAX_LAGG'. Did you mean 'MAX_LAG'")
    assert messages[1] == "RDBTASKS_HEALTH['MIN_WORKERS'] must be a number, not 'many'."
    assert dict(found.health) == {}


def test_a_short_retirement_window_is_raised_with_a_warning() -> None:
    found = read_project_settings({"RDBTASKS_RETIRE_AFTER": 5})
    assert found.retire_after == MIN_RETIRE_AFTER
    problem = only_problem(found)
    assert problem.check_id == "django_rdbtasks.W076" and "below 180s" in problem.message
    found.require("RDBTASKS_RETIRE_AFTER")  # a warning: nothing raised


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RDBTASKS_TASK_MODULES", "plugins", "must be a list of package names, not 'plugins'."),
        ("RDBTASKS_IMPORTS", ["ok", 5], "must be a list of module names, not ['ok', 5]."),
        ("RDBTASKS_JOBS", ["nightly"], "must be a dict of job name to job, not ['nightly']."),
        ("RDBTASKS_MISFIRE_GRACE", "a minute", "must be a number of at least 0, not 'a minute'."),
        ("RDBTASKS_MISFIRE_GRACE", -5, "must be a number of at least 0, not -5."),
        ("RDBTASKS_HTTP_ALLOWED_HOSTS", "api.example.com", "must be a list of host patterns"),
        ("RDBTASKS_RETENTION", "7d", "must be a dict of status to age"),
        ("RDBTASKS_HEALTH", [60], "must be a dict of limit name to number"),
        ("RDBTASKS_RETIRE_AFTER", "10m", "must be a number of seconds, not '10m'."),
        ("RDBTASKS_METRICS_TOKEN", 1234, "must be text, not int."),
        ("RDBTASKS_QUEUE_PERMISSIONS", {"emails": "mailing"}, "['emails'] must be a list of group"),
    ],
)
def test_a_bad_setting_is_its_default_and_a_problem_naming_it(
    name: str, value: Any, message: str
) -> None:
    found = read_project_settings({name: value})
    problem = only_problem(found)
    assert problem.setting == name and problem.message.startswith(name)
    assert message in problem.message
    assert found == ProjectSettings()
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        found.require(name)


@pytest.mark.parametrize(
    ("cls", "read"),
    [
        (BackendOptions, read_backend_options),
        (ProjectSettings, read_project_settings),
    ],
)
def test_every_setting_has_a_check_that_reports_a_bad_value(cls: type, read: Any) -> None:
    """A value of no acceptable type, for each field: reported under one of the field's ids."""
    for each in setting_fields(cls):
        assert each.checks, each.setting
        found = read({each.setting: object()})
        assert [problem.setting for problem in found.problems] == [each.setting]
        assert found.problems[0].check_id in each.checks, each.setting


# -- read once, following override_settings ------------------------------------------------


def test_the_settings_are_read_once_and_again_after_a_change() -> None:
    first = project_settings()
    assert project_settings() is first
    with override_settings(RDBTASKS_MISFIRE_GRACE=5):
        assert project_settings().misfire_grace == 5.0
        with override_settings(RDBTASKS_MISFIRE_GRACE=7):
            assert project_settings().misfire_grace == 7.0
        assert project_settings().misfire_grace == 5.0
    assert project_settings() == first
    with override_settings(LANGUAGE_CODE="fr"):  # not ours: kept
        assert project_settings() is project_settings()


def test_a_backend_reads_its_options_once(settings) -> None:
    from django_rdbtasks.compat import task_backends

    backend = task_backends["default"]
    assert backend.config == read_backend_options(backend.options)
    assert backend.max_attempts == backend.config.max_attempts
    settings.TASKS = {
        "default": {
            "BACKEND": "django_rdbtasks.backend.RDBTaskBackend",
            "OPTIONS": {"MAX_ATTEMPTS": 9, "PROGRESS_INTERVAL": "0.25"},
        }
    }
    assert task_backends["default"].config.max_attempts == 9
    assert task_backends["default"].config.progress_interval == 0.25


# -- the system checks -----------------------------------------------------------------------


def test_the_check_reports_each_bad_setting_under_its_id(settings) -> None:
    settings.RDBTASKS_MISFIRE_GRACE = "a minute"
    settings.RDBTASKS_HTTP_ALLOWED_HOSTS = "api.example.com"
    settings.RDBTASKS_RETIRE_AFTER = 60
    messages = {message.id: message for message in check_settings()}
    assert set(messages) == {
        "django_rdbtasks.E073",
        "django_rdbtasks.E074",
        "django_rdbtasks.W076",
    }
    assert "RDBTASKS_MISFIRE_GRACE must be a number" in messages["django_rdbtasks.E073"].msg
    assert messages["django_rdbtasks.W076"].level < messages["django_rdbtasks.E073"].level


def test_the_check_passes_good_settings(settings) -> None:
    settings.RDBTASKS_RETENTION = {"SUCCESSFUL": "7d"}
    settings.RDBTASKS_HEALTH = {"MAX_LAG": 300}
    assert check_settings() == []


# Django 6.1's check command reads the server's version.
@pytest.mark.django_db
def test_manage_py_check_stops_at_a_bad_setting(settings) -> None:
    settings.RDBTASKS_QUEUE_PERMISSIONS = ["ops"]
    with pytest.raises(SystemCheckError) as refused:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    assert "(django_rdbtasks.E078) RDBTASKS_QUEUE_PERMISSIONS must be a dict" in str(refused.value)


def test_the_backend_check_reports_its_options_problems(settings) -> None:
    from django_rdbtasks.backend import RDBTaskBackend

    backend = RDBTaskBackend(
        "x", {"OPTIONS": {"PROGRESS_INTERVAL": "often", "NOTIFY": "false", "MAX_ATEMPTS": 3}}
    )
    messages = [(message.id, message.msg) for message in backend.check()]
    assert (
        "django_rdbtasks.E003",
        "Task backend 'x': OPTIONS['PROGRESS_INTERVAL'] must be a "
        "number of at least 0, not 'often'.",
    ) in messages
    assert (
        "django_rdbtasks.E003",
        "Task backend 'x': OPTIONS['NOTIFY'] must be True or False, not 'false'.",
    ) in messages
    assert any(id_ == "django_rdbtasks.W001" for id_, _ in messages)
    assert len(backend.option_errors) == 2  # what enqueue refuses: not the unknown key


# -- the README's table ----------------------------------------------------------------------


def readme_settings_table() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(where, name, default, check ids) of each row of the README's "Settings reference"."""
    text = README.read_text()
    section = text[text.index("## Settings reference") :]
    section = section[: section.index("\n## ", 1)]
    rows = []
    where = ""
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| where "):
            continue
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        where = cells[0] or where
        ids = tuple(f"django_rdbtasks.{found}" for found in re.findall(r"[EWI]\d{3}", cells[3]))
        rows.append((where, cells[1].strip("`"), cells[2], ids))
    return rows


def test_the_readme_table_lists_exactly_the_settings_the_objects_read() -> None:
    expected = [
        ('`TASKS[alias]["OPTIONS"]`', each.setting, each.shown, each.checks)
        for each in setting_fields(BackendOptions)
    ] + [
        ("settings", each.setting, each.shown, each.checks)
        for each in setting_fields(ProjectSettings)
    ]
    assert readme_settings_table() == expected
    assert {row[1] for row in expected} == KNOWN_OPTIONS | set(PROJECT_SETTINGS)


# -- no other reader -------------------------------------------------------------------------


def raw_setting_reads(tree: ast.AST) -> list[str]:
    """``settings.RDBTASKS_X``, ``getattr(settings, "RDBTASKS_X")``, ``<backend>.options``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (
            node.attr.startswith("RDBTASKS_") or node.attr == "options"
        ):
            found.append(f"line {node.lineno}: .{node.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("RDBTASKS_")
        ):
            found.append(f"line {node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_no_module_but_conf_reads_the_raw_settings() -> None:
    readers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        found = raw_setting_reads(ast.parse(path.read_text(), str(path)))
        if found:
            readers[str(path.relative_to(PACKAGE))] = found
    # The backend hands its OPTIONS to conf.py once, in __init__.
    assert list(readers) == ["backend.py"] and len(readers["backend.py"]) == 1, readers
    assert "read_backend_options(self.options)" in (PACKAGE / "backend.py").read_text()


def test_the_walk_finds_each_kind_of_raw_read() -> None:
    tree = ast.parse(
        "settings.RDBTASKS_JOBS\ngetattr(settings, 'RDBTASKS_HEALTH', {})\nbackend.options.get('X')"
    )
    assert len(raw_setting_reads(tree)) == 3


def test_a_list_setting_may_be_any_iterable_of_names() -> None:
    found = read_project_settings({"RDBTASKS_IMPORTS": (name for name in ["a.tasks", "b.jobs"])})
    assert found.imports == ("a.tasks", "b.jobs") and found.problems == ()
