"""A user's task on django-crontask's scheduler: once a second, so a test sees ticks."""

from apscheduler.triggers.interval import IntervalTrigger
from crontask import cron
from django.tasks import task

from tests.testapp.models import SideEffect


@cron(IntervalTrigger(seconds=1))
@task
def tick() -> None:
    SideEffect.objects.create(key="cron-tick")
