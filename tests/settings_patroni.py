"""Settings for the processes of the Patroni tests: the database is a Patroni cluster.

``tests/test_patroni.py`` starts the cluster (``scripts/clusters/patroni.py``)
and runs migrate, a producer and the workers with these settings. The URL is
HAProxy's read-write address (one host) or libpq's multi-host form, which
django-environ turns into ``HOST="h1,h2,h3"``, ``PORT="p1,p2,p3"`` and
``OPTIONS={"target_session_attrs": "read-write", ...}``; psycopg passes them
to libpq as they are.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import env

DATABASES = {
    "default": env.db_url_config(
        os.environ.get("RDBTASKS_PATRONI_URL", "postgres://postgres@127.0.0.1:26000/postgres")
    )
}
DATABASES["default"].setdefault("OPTIONS", {}).update(
    {
        # A host that does not answer costs at most this long per attempt.
        "connect_timeout": 2,
        # A server that vanished without closing the connection is noticed
        # (directly; behind HAProxy, HAProxy answers these itself).
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
    }
)
# The failover tests' tasks; workers may import them.
RDBTASKS_TASK_MODULES = ["tests.failover_audit"]
# A tick every 2 seconds (cronsim's sixth field is the second), fired by the
# scheduler that runworkers starts, through the failover.
RDBTASKS_JOBS = {
    "failover-tick": {"task": "tests.failover_audit.failover_tick", "cron": "*/2 * * * * *"},
}
