"""A task new in the "newer release": a process started with RDBTASKS_TEST_OLD_RELEASE
plays a worker of the release before it was added (tests/test_missing.py)."""

import os

from django_rdbtasks.compat import HAS_DJANGO_TASKS

from .models import SideEffect

if HAS_DJANGO_TASKS:
    from django.tasks import task
else:
    from django_tasks import task


@task(max_attempts=2, backoff=0)
def added_in_new_release(key):
    SideEffect.objects.create(key=key, pid=os.getpid())
    return key


if os.environ.get("RDBTASKS_TEST_OLD_RELEASE"):
    del added_in_new_release
