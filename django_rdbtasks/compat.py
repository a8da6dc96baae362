"""One import site for the Tasks framework, whichever line of Django runs.

Django 6.1+ ships ``django.tasks``; Django 5.2 LTS uses the ``django-tasks``
backport. Libraries may declare tasks through the backport even on 6.1, so the
worker must accept ``Task`` objects of either API (``TASK_BASE_CLASSES``).
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

# Signal modules to send to: the framework's, plus the backport's when a
# project on 6.1 also has it installed, so receivers of either API hear us.
SIGNAL_MODULES: list = [framework_signals]
TASK_BASE_CLASSES: tuple[type, ...] = (Task,)

if HAS_DJANGO_TASKS:
    try:
        import django_tasks.base as _backport_base
        from django_tasks import signals as _backport_signals
    except ImportError:  # the backport is optional on 6.1
        pass
    else:
        SIGNAL_MODULES.append(_backport_signals)
        TASK_BASE_CLASSES = (Task, _backport_base.Task)

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "HAS_DJANGO_TASKS",
    "SIGNAL_MODULES",
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
    "normalize_json",
    "task_backends",
]
