"""The task ``enqueue_profile.py`` enqueues, declared where a worker could import it.

Not in the script itself: enqueue refuses a task defined in ``__main__``,
which no worker can load.
"""

from django_rdbtasks.compat import HAS_DJANGO_TASKS

if HAS_DJANGO_TASKS:
    from django.tasks import task
else:
    from django_tasks import task


@task()
def noop() -> None:
    """Module-level, as the framework requires; it never runs here."""
