"""A lane's outcomes written on a connection of their own while its round claims.

Why. One worker process drains at the pace of its lane's rounds: each round
writes what the runner finished and claims what it runs next, in one
statement, and the server runs a statement on one core. With short tasks
about half of a round's server time is the outcomes (their rows locked,
deleted and inserted into the finished table) and half the claim
(docs/benchmarks.md, "A quiet sitting"). Sent as two statements on two
connections at once, the two halves run side by side, on two backends, and
the round takes about as long as the longer of them.

When. Only where a round is one statement (PostgreSQL) and its outcomes need
nothing of the claim: a limited task's outcome stays in the round that claims,
since the slot it frees is handed over to the key's next task in the same
statement (docs/limits.md); and only for rounds of at least
``WRITE_BESIDE_FROM`` outcomes, which short tasks make. So the second
connection is opened only by a lane that drains short tasks, on its first such
round, and kept until the lane ends.

What is kept. Each half is a statement the worker already sends: an outcome
is fenced on its claim as in any round, and a claim is the same claim. A half
that fails leaves the other's work in place: the round thread retries the
claim (``retry_database``), and outcomes the writer could not write go back to
the lane, written by its next round.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from django.db import DatabaseError, connections

from ..db.rows import ClaimRequest, Exchange, Outcome
from .connection import close_in_thread
from .store import ClaimStore

logger = logging.getLogger("django_rdbtasks.worker")

#: The fewest outcomes a round writes beside its claim. Below this the two
#: statements' fixed costs (a round trip, a commit, a thread's hand-off) are
#: not worth the halved statement; and tasks that long keep a round small.
WRITE_BESIDE_FROM = 32


class BesideWriter:
    """A lane's second connection, and the thread that writes outcomes on it."""

    def __init__(self, alias: str, database: str, worker_id: str, thread_name: str) -> None:
        self.alias = alias
        self.database = database
        self.worker_id = worker_id
        self.thread_name = thread_name
        self._threads: ThreadPoolExecutor | None = None
        #: The writer's store, made in its thread (a connection is a thread's own).
        self._store: ClaimStore | None = None

    def takes(
        self, store: ClaimStore, outcomes: Sequence[Outcome], request: ClaimRequest | None
    ) -> bool:
        """Whether a round that writes ``outcomes`` and claims ``request`` writes them here."""
        return (
            request is not None
            and request.want > 0
            and len(outcomes) >= WRITE_BESIDE_FROM
            and store.dialect.exchange_is_one_statement
            and not any(outcome.limited for outcome in outcomes)
        )

    def write(self, outcomes: Sequence[Outcome]) -> Future[Exchange | None]:
        """Start writing ``outcomes``; the future's result is what was written, or
        None where the write failed (logged; its connection is dropped)."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(1, thread_name_prefix=self.thread_name)
        return self._threads.submit(self._write, list(outcomes))

    def _write(self, outcomes: list[Outcome]) -> Exchange | None:
        if self._store is None:
            self._store = ClaimStore(self.alias, self.database)
        try:
            return self._store.exchange(outcomes, self.worker_id, None)
        except (DatabaseError, UnicodeError) as exc:
            logger.warning(
                "could not write %d results beside the claim (%s): the next round writes them",
                len(outcomes),
                exc,
            )
            self._store.close()
            return None

    def close(self) -> None:
        """Its connection closed and its thread ended (what it was writing first)."""
        if self._threads is None:
            return
        self._threads.submit(self._close_connections).result()
        self._threads.shutdown()
        self._threads = None

    def _close_connections(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        close_in_thread(self.alias)
        connections.close_all()
