"""System checks as ``manage.py check`` runs them: in the README's project, once each."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from collections import Counter
from io import StringIO

import pytest
from django.core import checks as django_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection, models
from django.test.utils import isolate_apps

from django_rdbtasks.checks import (
    FRAMEWORK_CHECK_MODULES,
    check_foreign_keys_to_tasks,
    check_task_backends,
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
    assert {m.id for m in found} == {"django_rdbtasks.E030"}
    assert {m.obj for m in found} == {
        Invoice._meta.get_field("task"),
        through._meta.get_field("task"),  # the many-to-many's table
    }
    assert "db_constraint=False" in (found[0].hint or "")
    # The package's own relations to Task, and the test project's, pass.
    assert check_foreign_keys_to_tasks() == []
