"""Settings of the throwaway django-tasks-db project.

The database comes from the ``BENCH_DB_*`` variables that ``run.py`` sets.
``CONN_MAX_AGE = None`` keeps one connection for the worker's life: with
Django's default of 0, ``db_worker`` reconnects for every task and is about
three times slower, which would not be a fair comparison.
"""

import os

SECRET_KEY = "bench-only-not-secret"
DEBUG = False  # DEBUG would also log every query and turn on db_worker --reload
USE_TZ = True
INSTALLED_APPS = ["django_tasks", "django_tasks_db", "benchapp"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("BENCH_DB_NAME", "bench_tasksdb"),
        "HOST": os.environ.get("BENCH_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("BENCH_DB_PORT", "5432"),
        "USER": os.environ.get("BENCH_DB_USER", "postgres"),
        "PASSWORD": os.environ.get("BENCH_DB_PASSWORD", ""),
        "CONN_MAX_AGE": None,
    }
}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
