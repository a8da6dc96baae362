"""System checks as ``manage.py check`` runs them: in the README's project, once each."""

from __future__ import annotations

import datetime as dt
import importlib
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core import checks as django_checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection, models
from django.test.utils import isolate_apps

from django_rdbtasks.checks import (
    FRAMEWORK_CHECK_MODULES,
    check_declared_jobs,
    check_foreign_keys_to_tasks,
    check_task_backends,
    check_task_modules,
    mysql_isolation_level,
    sqlite_missing,
)
from django_rdbtasks.models import Task
from tests.conftest import ROOT

WAL = {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}


def manage_check(**env: str) -> tuple[int, Counter[str], str]:
    """``manage.py check`` in a project set up as the README says: exit code, ids, output."""
    process = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("RDBTASKS_TEST_README")},
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.settings_readme",
            **env,
        },
    )
    output = process.stdout + process.stderr
    ids = Counter(re.findall(r"\((django_rdbtasks\.\w+)\)", output))
    return process.returncode, ids, output


@pytest.mark.parametrize("backport", ["", "first", "last"])
def test_check_reports_a_bad_backend_once_in_the_readme_project(backport) -> None:
    """INSTALLED_APPS = [..., "django_rdbtasks"]: no django_tasks app, yet the backend is
    checked, and with the backport's app installed too (either order), not twice."""
    code, ids, output = manage_check(RDBTASKS_TEST_README_BACKPORT=backport)
    assert code == 1, output
    assert ids == {
        "django_rdbtasks.E003": 1,  # BACKOFF -1
        "django_rdbtasks.W001": 1,  # MAX_ATEMPTS
        "django_rdbtasks.W040": 1,  # SQLite without WAL
    }, output
    assert "OPTIONS['BACKOFF'] must be a number of at least 0, not -1" in output
    assert "unknown OPTIONS MAX_ATEMPTS" in output


def test_check_passes_the_readme_project_as_written() -> None:
    code, ids, output = manage_check(RDBTASKS_TEST_README_GOOD="1")
    assert (code, ids) == (0, Counter()), output
    assert "no issues" in output


def test_the_framework_checks_are_not_registered_beside_ours() -> None:
    """Each would check every backend again: the messages would come twice."""
    registered = django_checks.registry.registry.get_checks()
    assert check_task_backends in registered
    for name in FRAMEWORK_CHECK_MODULES:
        try:
            module = __import__(name, fromlist=["check_tasks"])
        except ImportError:
            continue
        assert module.check_tasks not in registered


# -- RDBTASKS_RETENTION ------------------------------------------------------------------------


# Django 6.1's check command reads the server's version.
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"SUCCESSFUL": 7}, "RDBTASKS_RETENTION['SUCCESSFUL']: 7 has no unit"),
        ({"SUCCESSFUL": "7"}, "'7' has no unit"),
        ({"FAILED": "1m"}, "'1m' is ambiguous"),
        ({"RUNNING": "7d"}, "'RUNNING' is not a finished status"),
        ("7d", "must be a dict"),
    ],
)
def test_check_refuses_a_retention_without_a_unit(settings, value, message) -> None:
    settings.RDBTASKS_RETENTION = value
    with pytest.raises(SystemCheckError) as refused:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    text = str(refused.value)
    assert "(django_rdbtasks.E020)" in text and message in text
    assert "HINT: Ages carry a unit" in text


# Django 6.1's check command reads the server's version.
@pytest.mark.django_db
@pytest.mark.parametrize(
    "value", [None, {}, {"SUCCESSFUL": "7d", "FAILED": "30d"}, {"CANCELLED": "12h30min"}]
)
def test_check_accepts_retention_with_units(settings, value) -> None:
    settings.RDBTASKS_RETENTION = value
    call_command("check", stdout=StringIO(), stderr=StringIO())


# Django 6.1's check command reads the server's version.
@pytest.mark.django_db
def test_check_accepts_retention_as_timedelta(settings) -> None:
    settings.RDBTASKS_RETENTION = {"SUCCESSFUL": dt.timedelta(days=7)}
    call_command("check", stdout=StringIO(), stderr=StringIO())


# -- SQLite with several processes (W040) ------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "missing"),
    [
        (WAL, []),
        ({**WAL, "transaction_mode": "EXCLUSIVE", "init_command": "pragma journal_mode = wal"}, []),
        ({**WAL, "timeout": "20"}, []),
        ({}, ["WAL journal mode", "IMMEDIATE transactions", "a busy timeout of 10 s or more"]),
        ({**WAL, "init_command": "PRAGMA synchronous=NORMAL;"}, ["WAL journal mode"]),
        ({**WAL, "transaction_mode": "DEFERRED"}, ["IMMEDIATE transactions"]),
        ({k: v for k, v in WAL.items() if k != "timeout"}, ["a busy timeout of 10 s or more"]),
        ({**WAL, "timeout": 2}, ["a busy timeout of 10 s or more"]),
    ],
)
def test_sqlite_missing(options, missing) -> None:
    settings = {"ENGINE": "django.db.backends.sqlite3", "OPTIONS": options}
    assert sqlite_missing(settings) == missing


@pytest.mark.parametrize("engine", ["postgresql", "mysql"])
def test_sqlite_missing_concerns_sqlite_only(engine) -> None:
    assert sqlite_missing({"ENGINE": f"django.db.backends.{engine}"}) == []


@pytest.mark.parametrize("name", [":memory:", "file:memorydb_default?mode=memory&cache=shared"])
def test_sqlite_missing_leaves_a_database_in_memory_alone(name) -> None:
    assert sqlite_missing({"ENGINE": "django.db.backends.sqlite3", "NAME": name}) == []


def test_the_test_settings_pass_the_sqlite_check() -> None:
    """tests/settings.py is what several worker processes run on: no W040 there."""
    messages = check_task_backends()
    assert [m.id for m in messages] == []


# -- MariaDB/MySQL: READ COMMITTED (W041) --------------------------------------------------


@pytest.mark.parametrize(
    ("options", "level"),
    [
        ({}, None),  # Django's default: read committed
        ({"isolation_level": "read committed"}, None),
        ({"isolation_level": "READ COMMITTED"}, None),
        ({"isolation_level": "repeatable read"}, "REPEATABLE READ"),
        ({"isolation_level": "serializable"}, "SERIALIZABLE"),
        ({"isolation_level": "read uncommitted"}, "READ UNCOMMITTED"),
        ({"isolation_level": None}, "the server's default"),
    ],
)
def test_mysql_isolation_level(options, level) -> None:
    found = mysql_isolation_level("mysql", {"OPTIONS": options})
    if level is None:
        assert found is None
    else:
        assert found is not None and found.startswith(level)


@pytest.mark.parametrize("vendor", ["postgresql", "sqlite"])
def test_mysql_isolation_level_concerns_mysql_only(vendor) -> None:
    assert mysql_isolation_level(vendor, {"OPTIONS": {"isolation_level": "serializable"}}) is None


def test_a_task_database_at_repeatable_read_is_warned_about(monkeypatch) -> None:
    """The backend's own alias, as configured: on MySQL/MariaDB, W041 names the risk."""
    from django.db import connections

    default = connections["default"]
    options = dict(default.settings_dict.get("OPTIONS") or {})
    monkeypatch.setitem(default.settings_dict, "OPTIONS", {**options, "isolation_level": None})
    messages = [m for m in check_task_backends() if m.id == "django_rdbtasks.W041"]
    if default.vendor != "mysql":
        assert messages == []
        return
    [message] = messages
    assert "'default'" in message.msg and "REPEATABLE READ" in message.msg
    assert "compensations can be enqueued twice" in message.msg
    monkeypatch.setitem(
        default.settings_dict, "OPTIONS", {**options, "isolation_level": "read committed"}
    )
    assert [m.id for m in check_task_backends()] == []


# -- MariaDB/MySQL: the partial indexes (models.W037) ------------------------------------------


@pytest.mark.django_db
def test_no_w037_for_the_task_indexes_where_an_equivalent_is_built() -> None:
    """StatusIndex and SearchIndex build a plain equivalent where partial indexes are missing."""
    if connection.vendor != "mysql":
        pytest.skip("models.W037 is MySQL's and MariaDB's")
    # Django itself would warn: the test shows the warning gone, not absent anyway.
    plain = models.Model.check.__func__(Task, databases=["default"])  # type: ignore[attr-defined]
    assert "models.W037" in [m.id for m in plain]
    assert "models.W037" not in [m.id for m in Task.check(databases=["default"])]
    out, err = StringIO(), StringIO()
    call_command("check", "--database", "default", stdout=out, stderr=err)
    assert "W037" not in out.getvalue() + err.getvalue()


def test_a_foreign_key_to_tasks_with_a_constraint_is_an_error_on_postgresql() -> None:
    with isolate_apps("tests.testapp") as isolated:

        class Invoice(models.Model):
            task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="+")
            loose = models.ForeignKey(
                Task, on_delete=models.SET_NULL, null=True, db_constraint=False, related_name="+"
            )
            batch = models.ManyToManyField(Task, related_name="+")

            class Meta:
                app_label = "testapp"

            def __str__(self) -> str:
                return str(self.pk)

        found = check_foreign_keys_to_tasks(app_configs=[isolated.get_app_config("testapp")])
    if connection.vendor != "postgresql":
        assert found == []  # rows never move there
        return
    through = Invoice._meta.get_field("batch").remote_field.through
    assert {m.id for m in found} == {"django_rdbtasks.E032"}
    assert {m.obj for m in found} == {
        Invoice._meta.get_field("task"),
        through._meta.get_field("task"),  # the many-to-many's table
    }
    assert "db_constraint=False" in (found[0].hint or "")
    # The package's own relations to Task, and the test project's, pass.
    assert check_foreign_keys_to_tasks() == []


# -- an operator's configuration mistakes, each named (issue 39) -----------------------------


@pytest.fixture
def bad_queue_module() -> Iterator[None]:
    """tests.operators_bad_queue imported afresh, and forgotten afterwards."""
    from django_rdbtasks.backend import DECLARED_OUTSIDE_QUEUES

    sys.modules.pop("tests.operators_bad_queue", None)
    yield
    sys.modules.pop("tests.operators_bad_queue", None)
    DECLARED_OUTSIDE_QUEUES.clear()


def test_a_queue_missing_from_queues_is_a_check_naming_queues_not_an_error_at_import(
    bad_queue_module,
) -> None:
    from django_rdbtasks.compat import InvalidTask

    module = importlib.import_module("tests.operators_bad_queue")  # no InvalidTask here
    errors = [m for m in check_task_modules() if m.id == "django_rdbtasks.E062"]
    assert len(errors) == 1
    assert errors[0].msg == (
        "Queue 'emials' is not valid for backend 'default': task "
        "tests.operators_bad_queue.send_newsletter uses it, and "
        "TASKS['default']['QUEUES'] is ['default', 'emails', 'other']. Add it to QUEUES, "
        "or give the task one of those (@task(queue_name=...) or .using(queue_name=...)). "
        "Did you mean 'emails'?"
    )
    # Refused where it would be written, in the same words.
    with pytest.raises(InvalidTask, match=r"TASKS\['default'\]\['QUEUES'\]"):
        module.send_newsletter.enqueue()
    # A queue that is there is not reported.
    module.send_newsletter.using(queue_name="emails")
    assert [m.id for m in check_task_modules() if m.id == "django_rdbtasks.E062"] == [
        "django_rdbtasks.E062"
    ]


def test_manage_check_names_queues_where_the_import_used_to_end_in_a_traceback() -> None:
    code, ids, output = manage_check(
        RDBTASKS_TEST_README_GOOD="1", RDBTASKS_TEST_README_IMPORTS="tests.operators_bad_queue"
    )
    assert code == 1, output
    assert ids == {"django_rdbtasks.E062": 1}, output
    assert "TASKS['default']['QUEUES'] is ['default', 'emails']" in output
    assert "tests.operators_bad_queue.send_newsletter" in output
    assert "Traceback" not in output


def test_a_misspelt_key_of_a_tasks_entry_is_an_error_with_the_key_meant(settings) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "django_rdbtasks.backend.RDBTaskBackend",
            "QUEUES": ["default"],
            "OPTION": {"MAX_ATTEMPTS": 5},
        }
    }
    errors = [m for m in check_task_backends() if m.id == "django_rdbtasks.E060"]
    assert [m.msg for m in errors] == [
        "TASKS['default'] has the key 'OPTION', which the Tasks framework does not read "
        "(it reads BACKEND, QUEUES, OPTIONS). Did you mean 'OPTIONS'?"
    ]


@pytest.mark.parametrize(
    ("queues", "message"),
    [
        ("default", "must be a list of queue names, not the string 'default': write ['default']"),
        (5, "must be a list of queue names, not 5"),
        (["default", ""], "must be a list of queue names, not ['default', '']"),
    ],
)
def test_queues_that_is_not_a_list_of_names_is_named(settings, queues, message) -> None:
    from tests.testapp.tasks import noop

    settings.TASKS = {
        "default": {"BACKEND": "django_rdbtasks.backend.RDBTaskBackend", "QUEUES": queues}
    }
    errors = [m.msg for m in check_task_backends() if m.id == "django_rdbtasks.E003"]
    assert errors == [f"Task backend 'default': TASKS['default']['QUEUES'] {message}."]
    # Not "Queue 'default' is not valid for backend": the setting is named, and nothing
    # is written (refused before the database is asked: no database in this test).
    with pytest.raises(ImproperlyConfigured, match=r"TASKS\['default'\]\['QUEUES'\]"):
        noop.enqueue()


def test_every_job_is_checked_and_each_error_named_a_misspelt_key_with_the_key_meant(
    settings,
) -> None:
    settings.RDBTASKS_JOBS = {
        "misspelt": {"task": "tests.testapp.tasks.noop", "cronn": "0 3 * * *"},
        "kwargs-list": {
            "task": "tests.testapp.tasks.record_job",
            "cron": "0 3 * * *",
            "kwargs": ["nightly"],
        },
        "bad-queue": {
            "task": "tests.testapp.tasks.noop",
            "cron": "0 3 * * *",
            "queue_name": "emials",
        },
        "bad-cron": {"task": "tests.testapp.tasks.noop", "cron": "* * * 13 *"},
        "good": {"task": "tests.testapp.tasks.noop", "cron": "0 3 * * *", "queue_name": "emails"},
    }
    errors = {m.msg.split(":")[0]: m for m in check_declared_jobs()}
    assert set(errors) == {
        "Job 'misspelt'",
        "Job 'kwargs-list'",
        "Job 'bad-queue'",
        "Job 'bad-cron'",
    }
    assert {m.id for m in errors.values()} == {"django_rdbtasks.E011"}
    assert "'cronn' is not a job's setting" in errors["Job 'misspelt'"].msg
    assert "Did you mean 'cron'?" in errors["Job 'misspelt'"].msg
    assert "kwargs must be a dict of keyword arguments, not ['nightly']" in (
        errors["Job 'kwargs-list'"].msg
    )
    assert "Queue 'emials' is not in TASKS['default']['QUEUES']" in errors["Job 'bad-queue'"].msg
    assert "Did you mean 'emails'?" in errors["Job 'bad-queue'"].msg
    assert "Invalid cron expression" in errors["Job 'bad-cron'"].msg
    # And together in manage.py check, where the misspelt key used to be a TypeError.
    with pytest.raises(SystemCheckError) as refused:
        call_command("check")
    assert all(name in str(refused.value) for name in errors)


def test_periodic_refuses_kwargs_that_are_not_a_dict() -> None:
    from django_rdbtasks.jobs import periodic
    from tests.testapp.tasks import record_job

    with pytest.raises(ImproperlyConfigured, match=r"kwargs must be a dict.*not \['nightly'\]"):
        periodic("0 3 * * *", kwargs=["nightly"])(record_job)


@pytest.fixture
def periodic_module_unimported(monkeypatch) -> Iterator[None]:
    """tests.testapp.periodic_tasks as a worker has it: never imported (and its job forgotten)."""
    from django_rdbtasks import jobs

    monkeypatch.setattr(jobs, "_decorated", dict(jobs._decorated))
    had = sys.modules.pop("tests.testapp.periodic_tasks", None)
    yield
    sys.modules.pop("tests.testapp.periodic_tasks", None)
    if had is not None:
        sys.modules["tests.testapp.periodic_tasks"] = had


def test_periodic_in_a_module_no_worker_imports_is_warned_about(
    settings, periodic_module_unimported
) -> None:
    warnings = [m for m in check_task_modules() if m.id == "django_rdbtasks.W064"]
    assert [m.msg for m in warnings] == [
        "tests.testapp.periodic_tasks declares @periodic jobs (heartbeat), but no worker "
        "imports it: they would never be scheduled."
    ]
    assert "RDBTASKS_IMPORTS" in warnings[0].hint
    settings.RDBTASKS_IMPORTS = ["tests.testapp.periodic_tasks"]
    assert [m for m in check_task_modules() if m.id == "django_rdbtasks.W064"] == []


def test_a_task_module_that_fails_to_import_is_an_error_not_a_traceback(settings) -> None:
    settings.RDBTASKS_IMPORTS = ["tests.testapp.broken_import"]
    errors = [m for m in check_task_modules() if m.id == "django_rdbtasks.E063"]
    assert len(errors) == 1
    assert errors[0].msg.startswith(
        "Importing tests.testapp.broken_import failed: ModuleNotFoundError"
    )
