"""The test settings on an in-memory SQLite database: runworkers must refuse it."""

from tests.settings import *  # noqa: F403

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
