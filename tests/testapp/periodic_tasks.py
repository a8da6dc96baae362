from django_rdbtasks.jobs import periodic

from .tasks import task


@periodic("*/5 * * * *")
@task()
def heartbeat():
    return "alive"
