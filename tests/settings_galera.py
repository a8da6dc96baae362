"""Settings of the processes tests/test_galera.py starts against a Galera node.

``DATABASE_URL`` names one node (``mysql://root@127.0.0.1:3306N/<db>``) and,
with ``RDBTASKS_TEST_WORKER`` and ``RDBTASKS_TEST_DB`` set as the test sets
them, the database is the one the test created on the cluster. The only
difference from ``tests.settings``: lost races are logged (at debug), so the
test can count the certification conflicts the workers met and retried.
"""

from typing import Any, cast

from tests import settings as _base
from tests.settings import *  # noqa: F403

_loggers = cast(dict[str, Any], _base.LOGGING["loggers"])
LOGGING = {
    **_base.LOGGING,
    "loggers": {**_loggers, "django_rdbtasks.races": {"level": "DEBUG"}},
}
