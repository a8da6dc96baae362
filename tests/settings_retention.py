"""tests/settings.py with the retention a user once wrote: 7, meaning a week, read as seconds.

tests/test_retention.py starts ``runworkers`` on it: the scheduler must never prune by it.
"""

from tests.settings import *  # noqa: F403

RDBTASKS_RETENTION = {"SUCCESSFUL": 7}
