"""System checks: bad job declarations fail ``manage.py check`` and worker start-up."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ValidationError


@checks.register()
def check_declared_jobs(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from .jobs import declared_jobs, validate_task_path

    errors: list[checks.CheckMessage] = []
    try:
        jobs = declared_jobs()
    except TypeError as exc:
        return [checks.Error(f"RDBTASKS_JOBS: {exc}", id="django_rdbtasks.E010")]
    for name, spec in jobs.items():
        try:
            spec.validate()
            if not spec.task_path:
                raise ValidationError("it names no task ('task': 'app.tasks.function').")
            validate_task_path(spec.task_path)
        except ValidationError as exc:
            errors.append(
                checks.Error(f"Job {name!r}: {'; '.join(exc.messages)}", id="django_rdbtasks.E011")
            )
    return errors


@checks.register()
def check_retention(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django.core.exceptions import ImproperlyConfigured

    from .retention import retention_setting

    try:
        retention_setting()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="django_rdbtasks.E020")]
    return []
