"""Settings of the benchmark's django-rdbtasks project.

The database comes from the ``BENCH_DB_*`` variables that ``run.py`` sets.
``CONN_MAX_AGE`` is left at Django's default of 0 on purpose: the worker is
meant to hold its connection for its life whatever this says, and the peer
(django-tasks-db) is given ``None``, its best case.
"""

import os

SECRET_KEY = "bench-only-not-secret"
DEBUG = False  # DEBUG would log every query
USE_TZ = True
INSTALLED_APPS = ["django_rdbtasks", "benchapp"]
DATABASES = {
    "default": {
        # BENCH_DB_ENGINE=mysql: bench/pinned_mysql.py's runs on MariaDB/MySQL.
        "ENGINE": "django.db.backends." + os.environ.get("BENCH_DB_ENGINE", "postgresql"),
        "NAME": os.environ.get("BENCH_DB_NAME", "bench_rdbtasks"),
        "HOST": os.environ.get("BENCH_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("BENCH_DB_PORT", "5432"),
        "USER": os.environ.get("BENCH_DB_USER", "postgres"),
        "PASSWORD": os.environ.get("BENCH_DB_PASSWORD", ""),
    }
}
TASKS = {
    "default": {
        "BACKEND": "django_rdbtasks.backend.RDBTaskBackend",
        "QUEUES": ["default"],
        "OPTIONS": {},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The logging a user has: a new `startproject` (no LOGGING of its own, so Django's
# defaults) plus one handler on the root logger, with no level, as Django's logging
# how-to configures a handler (https://docs.djangoproject.com/en/5.2/howto/logging/).
# Nothing tuned for the benchmark: on Django 6.1, whose `django` logger passes INFO,
# the Tasks framework's own records of each task reach this handler.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"]},
}
# bench/sustained.py: finished tasks kept as a user would configure it ("2min"),
# applied by the scheduler that runworkers starts.
if os.environ.get("BENCH_RETENTION"):
    RDBTASKS_RETENTION = dict.fromkeys(
        ("SUCCESSFUL", "FAILED", "CANCELLED"), os.environ["BENCH_RETENTION"]
    )

# docs/benchmarks.md, "Per-task logging": the logging of a new startproject
# (DEBUG on, LOGGING unset: Django's default logging sends the django loggers,
# the framework's django.tasks among them, to the console at INFO) with a root
# handler at BENCH_ROOT_LOG_LEVEL, as projects usually add one.
if os.environ.get("BENCH_ROOT_LOG_LEVEL"):
    DEBUG = True
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"console": {"class": "logging.StreamHandler"}},
        "root": {"handlers": ["console"], "level": os.environ["BENCH_ROOT_LOG_LEVEL"]},
    }
