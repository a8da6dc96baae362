"""A task declared outside every installed app, as in a project package that is not one.

This process can enqueue it only by importing this module; a worker, which
imports installed apps and ``RDBTASKS_TASK_MODULES`` only, could not run it.
"""

from django_rdbtasks.compat import HAS_DJANGO_TASKS

if HAS_DJANGO_TASKS:
    from django.tasks import task
else:
    from django_tasks import task


@task()
def report(day: str) -> str:
    return day
