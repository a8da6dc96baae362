"""One import site for the Tasks framework, whichever line of Django runs.

Django 6.1+ ships ``django.tasks``; Django 5.2 LTS uses the ``django-tasks``
backport. Libraries may declare tasks through the backport even on 6.1, so the
worker must accept ``Task`` objects of either API (``TASK_BASE_CLASSES``).

Signals go to ``framework_signals`` only, the framework this backend is a
backend of: on 6.1 with the backport also installed, sending to both made
each failure logged twice, once by each framework's receiver.
"""

from __future__ import annotations

import django

HAS_DJANGO_TASKS = django.VERSION >= (6, 1)

if HAS_DJANGO_TASKS:
    from django.tasks import signals as framework_signals
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_QUEUE_NAME,
        TASK_REFRESH_ATTRS,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.utils.json import normalize_json
else:
    from django_tasks import signals as framework_signals
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        DEFAULT_TASK_QUEUE_NAME,
        TASK_REFRESH_ATTRS,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.utils import normalize_json

TASK_BASE_CLASSES: tuple[type, ...] = (Task,)

if HAS_DJANGO_TASKS:
    try:
        import django_tasks.base as _backport_base
    except ImportError:  # the backport is optional on 6.1
        pass
    else:
        TASK_BASE_CLASSES = (Task, _backport_base.Task)

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "HAS_DJANGO_TASKS",
    "TASK_BASE_CLASSES",
    "TASK_REFRESH_ATTRS",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "framework_signals",
    "normalize_json",
    "task_backends",
]
