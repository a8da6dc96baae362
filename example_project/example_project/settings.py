"""Example project: SQLite by default, any database through DATABASE_URL.

DATABASE_URL=postgres://postgres@127.0.0.1:5432/test
DATABASE_URL=mysql://root@127.0.0.1:3306/test
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = env("SECRET_KEY", default="example-only-not-secret")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_rdbtasks",
    "shop",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "example_project.urls"
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
# An empty DATABASE_URL (as make passes it for SQLite) means the default too.
DATABASES = {
    "default": env.db_url_config(
        env("DATABASE_URL", default="") or f"sqlite:///{BASE_DIR / 'db.sqlite3'}"
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Several worker processes write to one file: wait for the lock, and take
    # it when a transaction begins rather than upgrading a read lock later.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            # Readers do not block the writer's commit (the default journal does).
            "init_command": "PRAGMA journal_mode=WAL;",
        }
    )
# Its tests' database (make test runs two Django lines side by side on one server).
# On SQLite a file, not memory: a real worker's processes must open it too
# (docs/testing.md).
_test_name = env("TEST_DATABASE_NAME", default="")
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    _test_name = str(BASE_DIR / f"{_test_name or 'test_db'}.sqlite3")
if _test_name:
    DATABASES["default"]["TEST"] = {"NAME": _test_name}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"

TASKS = {
    "default": {
        "BACKEND": "django_rdbtasks.backend.RDBTaskBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"MAX_ATTEMPTS": 3, "BACKOFF": 2.0},
    }
}
