"""The test database with the logging of a new ``startproject``, and a root handler.

``startproject`` leaves DEBUG on and LOGGING unset: Django's default logging
then sends the ``django`` loggers (the framework's ``django.tasks`` among them)
to the console at INFO. Projects usually add a root handler; its level comes
from RDBTASKS_TEST_ROOT_LOG_LEVEL (tests/test_task_logging.py).
"""

import os

from tests.settings import *  # noqa: F403

DEBUG = True
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {
        "handlers": ["console"],
        "level": os.environ.get("RDBTASKS_TEST_ROOT_LOG_LEVEL", "INFO"),
    },
}
