"""The channels PostgreSQL's workers are woken on (``LISTEN``: worker/listener.py)."""

from __future__ import annotations

#: Rows that became READY, the payload their queue: what ``READY_CHANNEL`` does
#: not announce (requeues, a queue resumed, ``rdbtasks_enqueue_v1`` and the
#: rest of an older release). A worker's lanes read from the head after one
#: (db/frontier.py).
NOTIFY_CHANNEL = "rdbtasks"
#: Rows an enqueue (or a dependant's release, a task given back: ``notify_ready``)
#: made READY: ``priority|start|queue``, where ``start`` is the
#: enqueuing transaction's start in microseconds since the epoch (one less:
#: a start only ever lowers a frontier). Every fresh row it wrote has a
#: ``run_after`` at or after it (db/frontier.py). PostgreSQL sends equal
#: payloads of one transaction once.
READY_CHANNEL = "rdbtasks_ready"


def ready_payload(queue: str, priority: str) -> str:
    """``READY_CHANNEL``'s payload as SQL, of the SQL expressions ``queue`` and ``priority``."""
    return (
        f"{priority}::text || '|' || ((extract(epoch FROM transaction_timestamp()) "
        f"* 1000000)::bigint - 1)::text || '|' || {queue}"
    )


#: A freed slot of a limit: the payload the queue of the task that held it
#: (``limited.py``).
SLOT_CHANNEL = "rdbtasks_slot"
