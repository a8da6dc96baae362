"""Settings for the replica test's processes: ``default`` a primary, ``replica`` its standby.

``tests/test_replica.py`` starts the pair (``scripts/clusters/pg_pair.py`` on
its own ports) and runs migrate and the pages with these settings. The task
backend reads what only shows off the standby (``READ_DATABASE``).
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import TASKS


def _server(port: str) -> dict:
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("RDBTASKS_REPLICA_DB", "rdbtasks_replica"),
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": port,
        "OPTIONS": {"connect_timeout": 2},
    }


DATABASES = {
    "default": _server(os.environ.get("RDBTASKS_PRIMARY_PORT", "27432")),
    "replica": _server(os.environ.get("RDBTASKS_STANDBY_PORT", "27433")),
}
TASKS = {
    **TASKS,
    "default": {
        **TASKS["default"],
        "OPTIONS": {**TASKS["default"]["OPTIONS"], "READ_DATABASE": "replica"},
    },
}
ALLOWED_HOSTS = ["testserver"]
ROOT_URLCONF = "tests.browser.urls"
