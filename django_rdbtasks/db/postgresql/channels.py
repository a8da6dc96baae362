"""The channels PostgreSQL's workers are woken on (``LISTEN``: worker/listener.py)."""

from __future__ import annotations

#: New rows: the payload the queue the enqueue wrote to (``inserts.py``).
NOTIFY_CHANNEL = "rdbtasks"
#: A freed slot of a limit: the payload the queue of the task that held it
#: (``limited.py``).
SLOT_CHANNEL = "rdbtasks_slot"
