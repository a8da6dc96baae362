"""tests/settings.py plus real libraries that declare tasks of their own (tests/libraries/).

``make test`` runs that directory with these settings, after the main suite,
on every database of each Django line: ``pytest --ds tests.settings_libraries
tests/libraries``. Nothing here tells django-rdbtasks about the libraries'
tasks (no ``RDBTASKS_TASK_MODULES``): they must run as a new user's would.

- Wagtail (both lines): page saves enqueue ``modelsearch.tasks`` (the
  ``modelsearch`` distribution Wagtail requires is no installed app) and
  ``wagtail.tasks``. Wagtail declares them with the django-tasks backport, on
  Django 6.1 too.
- django-crontask and django-maintenance-tasks need Django 6.0+ and Python
  3.12+: the Django 6.1 line only, where they declare tasks with django.tasks.
"""

from django_rdbtasks.compat import HAS_DJANGO_TASKS
from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, INSTALLED_APPS

INSTALLED_APPS = [
    *INSTALLED_APPS,
    "tests.libraries.pages",
    "wagtail.users",
    "wagtail.admin",
    "wagtail.search",
    "wagtail",
    "modelcluster",
    "taggit",
]
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    # Wagtail's search index uses PostgreSQL's search fields there (Django 6.1 checks it).
    INSTALLED_APPS.append("django.contrib.postgres")
if HAS_DJANGO_TASKS:
    INSTALLED_APPS += [
        "crontask",
        "maintenance_tasks",
        "tests.libraries.cron",
        "tests.libraries.backfill",
    ]
    # Each batch of a backfill re-enqueues the next from inside the worker
    # (MAX_RUNTIME is the seconds one job may run before it does).
    MAINTENANCE_TASKS = {"MAX_RUNTIME": 0}

WAGTAIL_SITE_NAME = "django-rdbtasks tests"
WAGTAILADMIN_BASE_URL = "http://testserver"
ROOT_URLCONF = "tests.libraries.urls"
# The editor's password: a hash made in microseconds, not in the half second
# (more on a loaded machine) that Django's default takes on purpose.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# The tests check that the worker ran the library's tasks, so the settings
# that would silence them are left as the libraries ship them.
SILENCED_SYSTEM_CHECKS: list[str] = []
