"""Test settings: the database comes from DATABASE_URL (SQLite when unset)."""

import os
from typing import Any

import environ

env = environ.Env()
DATABASE_URL = os.environ.get("DATABASE_URL") or (
    "sqlite:///" + os.path.join(os.path.dirname(__file__), "test.sqlite3")
)
DATABASES = {"default": env.db_url_config(DATABASE_URL)}
# Worker processes started by the tests must open the test database, so its
# name is fixed here and RDBTASKS_TEST_WORKER makes it the one they use.
# RDBTASKS_TEST_DB lets two test runs share a server without sharing a database.
_test_db = os.environ.get("RDBTASKS_TEST_DB", "test_rdbtasks")
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    TEST_DB_NAME = os.path.join(os.path.dirname(__file__), f"{_test_db}.sqlite3")
    # Several processes write: wait for the lock, and take it when a
    # transaction begins rather than upgrading a read lock (which fails at once).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            # Readers do not block the writer's commit (the default journal does).
            "init_command": "PRAGMA journal_mode=WAL;",
        }
    )
else:
    TEST_DB_NAME = _test_db
DATABASES["default"]["TEST"] = {"NAME": TEST_DB_NAME}
if os.environ.get("RDBTASKS_TEST_WORKER"):
    DATABASES["default"]["NAME"] = TEST_DB_NAME

# The suite through a transaction pooler (tests/test_pgbouncer.py): DATABASE_URL
# is the PgBouncer, RDBTASKS_TEST_DIRECT_URL the server itself, for LISTEN.
DIRECT_URL = os.environ.get("RDBTASKS_TEST_DIRECT_URL")
if DIRECT_URL:
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    DATABASES["direct"] = env.db_url_config(DIRECT_URL)
    DATABASES["direct"]["TEST"] = {"MIRROR": "default"}
    if os.environ.get("RDBTASKS_TEST_WORKER"):
        DATABASES["direct"]["NAME"] = TEST_DB_NAME

# A second alias on the same database, for the READ_DATABASE tests (tests/test_reads.py):
# its own connection, so the queries each alias ran can be told apart.
DATABASES["replica"] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}

SECRET_KEY = "tests"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    # The admin tests need these when the test database is created.
    "django.contrib.admin",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django_rdbtasks",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ROOT_URLCONF = "tests.browser.urls"
STATIC_URL = "/static/"
TASKS: dict[str, dict[str, Any]] = {
    "default": {
        "BACKEND": "django_rdbtasks.backend.RDBTaskBackend",
        "QUEUES": ["default", "emails", "other"],
        "OPTIONS": {
            "MAX_ATTEMPTS": 3,
            "BACKOFF": 0.05,
            "PROGRESS_INTERVAL": 0.1,
            "TIMEOUT_GRACE": 0.5,
        },
    }
}
if DIRECT_URL:
    TASKS["default"]["OPTIONS"]["TRANSACTION_POOLING"] = True
    if not os.environ.get("RDBTASKS_TEST_POLL_ONLY"):
        TASKS["default"]["OPTIONS"]["LISTEN_DATABASE"] = "direct"
# Workers of an "older release" (tests/test_missing.py) give up sooner on tasks they lack.
if os.environ.get("RDBTASKS_TEST_MISSING_TASK_GRACE"):
    TASKS["default"]["OPTIONS"]["MISSING_TASK_GRACE"] = float(
        os.environ["RDBTASKS_TEST_MISSING_TASK_GRACE"]
    )
# Workers whose results may be bigger than the server takes (tests/test_storable.py):
# the database's own refusal is then what the worker meets.
if os.environ.get("RDBTASKS_TEST_MAX_RESULT_BYTES"):
    TASKS["default"]["OPTIONS"]["MAX_RESULT_BYTES"] = int(
        os.environ["RDBTASKS_TEST_MAX_RESULT_BYTES"]
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The contract tests declare their tasks in their own module, not in an app:
# enqueue refuses a task whose module a worker would not import.
RDBTASKS_TASK_MODULES = ["tests.test_contract"]
# Some test modules declare a task outside the apps on purpose, to test that
# enqueue refuses it (tests/not_an_app.py, tests/test_sagas.py): once imported,
# the check of declared tasks would fail every other test that runs the checks.
# tests/test_loading.py runs that check with this list emptied.
# tests.testapp.periodic_tasks declares a job only the tests that import it
# want: no worker imports it, on purpose (its W064 is tested in test_checks.py).
SILENCED_SYSTEM_CHECKS = ["django_rdbtasks.E012", "django_rdbtasks.W064"]
# Processes started by the record check-out tests load the processor.
if os.environ.get("RDBTASKS_TEST_PROCESSORS"):
    RDBTASKS_IMPORTS = ["tests.testapp.processors"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_rdbtasks": {"handlers": ["console"], "level": "INFO"},
        # The framework's record of a failed task, in worker processes' logs.
        "django.tasks": {"handlers": ["console"], "level": "ERROR"},
        "django_tasks": {"handlers": ["console"], "level": "ERROR"},
    },
}
