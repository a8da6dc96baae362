"""Settings for the processes of the failover test: the database is a primary/standby pair.

``tests/test_failover.py`` starts the pair (``scripts/clusters/pg_pair.py``)
and runs migrate, a producer and the workers with these settings. They reach
whichever server accepts writes through libpq's multi-host form: Django passes
``HOST``, ``PORT`` and ``OPTIONS`` to psycopg, which passes them to libpq.
"""

import os

from tests.settings import *  # noqa: F403

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("RDBTASKS_FAILOVER_DB", "rdbtasks_failover"),
        "USER": "postgres",
        "HOST": os.environ.get("RDBTASKS_FAILOVER_HOSTS", "127.0.0.1,127.0.0.1"),
        "PORT": os.environ.get("RDBTASKS_FAILOVER_PORTS", "25432,25433"),
        "OPTIONS": {
            # Only the server that accepts writes: the standby refuses the
            # session until it is promoted, so nobody writes to a read-only one.
            "target_session_attrs": "read-write",
            # A dead host costs at most this long per connection attempt.
            "connect_timeout": 2,
            # A server that vanished without closing the connection is noticed.
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 3,
        },
    }
}
# The failover tests' task lives there; workers may import it.
RDBTASKS_TASK_MODULES = ["tests.failover_audit"]
