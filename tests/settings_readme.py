"""A project configured exactly as the README's Install section says, for ``manage.py check``.

``INSTALLED_APPS`` holds this app and not ``django_tasks`` (on Django 5.2 the
backport's app is what registered the backends' checks), and ``TASKS`` carries
the typos a user makes. tests/test_checks.py runs ``manage.py check`` on it in
a process of its own, since INSTALLED_APPS is read once per process.

RDBTASKS_TEST_README_BACKPORT=first|last adds ``django_tasks`` before or after
this app; RDBTASKS_TEST_README_IMPORTS names modules for RDBTASKS_IMPORTS (comma
separated); RDBTASKS_TEST_README_GOOD=1 gives TASKS and DATABASES as the README has
them, SQLite's OPTIONS included.
"""

import os
import tempfile
from pathlib import Path

SECRET_KEY = "readme"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = ["django_rdbtasks"]
_backport = os.environ.get("RDBTASKS_TEST_README_BACKPORT")
if _backport == "first":
    INSTALLED_APPS.insert(0, "django_tasks")
elif _backport == "last":
    INSTALLED_APPS.append("django_tasks")

_good = bool(os.environ.get("RDBTASKS_TEST_README_GOOD"))

# Django 6.1's check opens the database (for its version): a file out of the tree.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(Path(tempfile.gettempdir()) / "rdbtasks-readme.sqlite3"),
    }
}
if _good:
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL;",
    }

TASKS = {
    "default": {
        "BACKEND": "django_rdbtasks.backend.RDBTaskBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": (
            {"MAX_ATTEMPTS": 3, "BACKOFF": 1.0} if _good else {"MAX_ATEMPTS": 3, "BACKOFF": -1}
        ),
    }
}

if os.environ.get("RDBTASKS_TEST_README_IMPORTS"):
    RDBTASKS_IMPORTS = os.environ["RDBTASKS_TEST_README_IMPORTS"].split(",")
