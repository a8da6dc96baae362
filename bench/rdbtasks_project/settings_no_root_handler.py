"""The benchmark's settings less their root handler: Django's default logging alone.

For comparisons only (``bench/profile_drain.py --settings settings_no_root_handler``):
what the Tasks framework's per-task records cost a drain, against ``settings``.
"""

from settings import *  # noqa: F403

del LOGGING  # noqa: F821 (defined by the star import)
