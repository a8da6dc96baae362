"""A task declared with a queue its backend's QUEUES lacks (a typo of "emails").

Imported by tests/test_checks.py, in its own process or with the record of it
removed afterwards: importing it must not fail, ``manage.py check`` must name
the task and QUEUES (E062), and enqueueing it must be refused.
"""

from django_rdbtasks.compat import HAS_DJANGO_TASKS

if HAS_DJANGO_TASKS:
    from django.tasks import task
else:
    from django_tasks import task


@task(queue_name="emials")
def send_newsletter():
    return None
