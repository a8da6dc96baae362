"""Rows and users for the operations tests (admin, snapshots, commands, retention, browser)."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from collections.abc import Iterable
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import connection

from django_rdbtasks.jobs import database_now
from django_rdbtasks.models import Task, TaskStatus, Worker
from django_rdbtasks.snapshots import uuid7_floor

ADMIN_MISSING = (
    "The admin tests need django.contrib.admin, sessions, messages and staticfiles in "
    "INSTALLED_APPS with their MIDDLEWARE and TEMPLATES, as tests/settings.py has them."
)

TRACEBACK = """Traceback (most recent call last):
  File "/srv/app/worker.py", line 12, in run
    return task.call(*args)
  File "/srv/app/tasks.py", line 3, in always_fails
    raise ValueError(message)
ValueError: boom
"""


def admin_urls() -> list[pytest.MarkDecorator]:
    """The admin tests' URLs (pytest-django's marker needs a ROOT_URLCONF to restore)."""
    if getattr(settings, "ROOT_URLCONF", None) is None:
        return []  # the admin is not set up: require_admin says so
    return [pytest.mark.urls("tests.browser.urls")]


@pytest.fixture
def require_admin() -> None:
    if "django.contrib.admin" not in settings.INSTALLED_APPS:
        pytest.fail(ADMIN_MISSING, pytrace=False)


def now() -> dt.datetime:
    return database_now(connection.alias)


def attempt(
    number: int,
    outcome: str,
    *,
    worker_id: str = "host-a:101:0:abcd",
    started: dt.datetime | None = None,
    seconds: float = 0.25,
    error: bool = True,
) -> dict[str, Any]:
    started = started or now() - dt.timedelta(minutes=10)
    entry: dict[str, Any] = {
        "attempt": number,
        "worker_id": worker_id,
        "started_at": started.isoformat(),
        "finished_at": (started + dt.timedelta(seconds=seconds)).isoformat(),
        "outcome": outcome,
    }
    if error:
        entry["exception_class_path"] = "builtins.ValueError"
        entry["traceback"] = TRACEBACK
    return entry


def uuid7_at(moment: dt.datetime) -> uuid.UUID:
    """A task id as if enqueued at ``moment`` (UUIDv7 carries its time)."""
    return uuid.UUID(int=uuid7_floor(moment).int | random.getrandbits(62))


def make_task(status: str = TaskStatus.READY, **fields: Any) -> Task:
    """A task row as the worker would have left it in ``status``."""
    moment = fields.pop("at", None) or now()
    values: dict[str, Any] = {
        "id": uuid7_at(moment),
        "task_path": "tests.testapp.tasks.add",
        "queue_name": "default",
        "status": status,
        "args": [1, 2],
        "kwargs": {},
        "max_attempts": 3,
        "enqueued_at": moment,
        "run_after": moment,
    }
    if status in (TaskStatus.SUCCESSFUL, TaskStatus.FAILED, TaskStatus.CANCELLED):
        values.update(
            attempts=1,
            started_at=moment,
            last_attempted_at=moment,
            finished_at=moment + dt.timedelta(seconds=1),
        )
    if status == TaskStatus.FAILED:
        values.update(
            attempts=2,
            max_attempts=2,
            history=[attempt(1, "RETRY", started=moment), attempt(2, "FAILED", started=moment)],
        )
    if status == TaskStatus.SUCCESSFUL:
        values.update(
            return_value=3, history=[attempt(1, "SUCCESSFUL", started=moment, error=False)]
        )
    if status == TaskStatus.RUNNING:
        values.update(
            attempts=1,
            worker_id="host-a:101:0:abcd",
            started_at=moment,
            last_attempted_at=moment,
            lease_expires_at=moment + dt.timedelta(seconds=30),
        )
    values.update(fields)
    return Task.objects.create(**values)


def make_worker(name: str = "host-a:101", *, age: float = 0.0, **fields: Any) -> Worker:
    """A registry row whose last heartbeat was ``age`` seconds ago."""
    heartbeat = now() - dt.timedelta(seconds=age)
    host, _, pid = name.partition(":")
    values: dict[str, Any] = {
        "name": name,
        "host": host,
        "pid": int(pid or 1),
        "queues": ["default", "emails"],
        "mode": "optimistic",
        "threads": 2,
        "batch": 1,
        "started_at": heartbeat - dt.timedelta(hours=1),
        "last_heartbeat_at": heartbeat,
        "running": 1,
        "done": 120,
        "failed": 3,
    }
    values.update(fields)
    return Worker.objects.create(**values)


def staff(username: str, permissions: Iterable[str] = (), *, superuser: bool = False) -> User:
    """A staff user with the given ``app_label.codename`` permissions."""
    user = User.objects.create_user(username, password="pw", is_staff=True, is_superuser=superuser)
    for name in permissions:
        app_label, codename = name.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return User.objects.get(pk=user.pk)  # a fresh object: no cached permissions


# -- the admin tests' client helpers ------------------------------------------------------------

VIEW = ["django_rdbtasks.view_task"]
RETRY = [*VIEW, "django_rdbtasks.retry_task"]
CANCEL = [*VIEW, "django_rdbtasks.cancel_task"]
DISCARD = [*VIEW, "django_rdbtasks.delete_task"]
JOB_VIEW = ["django_rdbtasks.view_job", "django_rdbtasks.change_job"]


def client_for(*permissions: str, superuser: bool = False, name: str = "op") -> Any:
    from django.test import Client

    client = Client()
    client.force_login(staff(name, permissions, superuser=superuser))
    return client


def url(name: str, *args: object) -> str:
    from django.urls import reverse

    return reverse(f"admin:django_rdbtasks_{name}", args=args)


def log_messages(obj: Any, action_flag: int | None = None) -> list[str]:
    """The admin log's change messages about ``obj`` (CHANGE entries unless told)."""
    from django.contrib.admin.models import CHANGE, LogEntry

    return list(
        LogEntry.objects.filter(
            object_id=str(obj.pk), action_flag=CHANGE if action_flag is None else action_flag
        )
        .order_by("pk")
        .values_list("change_message", flat=True)
    )


def text(response: Any) -> str:
    return response.content.decode()


def in_groups(user: User, *names: str) -> User:
    from django.contrib.auth.models import Group

    for name in names:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    return User.objects.get(pk=user.pk)
