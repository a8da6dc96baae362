"""The claim store: every statement the worker makes about tasks.

Claiming, writing outcomes, renewing leases, saving progress, following a
Job's record and settling dependants all go through here, on the worker's own
connection (see ``connection.py``). One store per thread: Django connections
belong to the thread that opened them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections

from ..database_errors import describe, is_lost_race, is_refusal
from ..db import dialect_for
from ..db.base import Dialect
from ..db.outcomes import SETTLES_DEPENDANTS
from ..db.rows import ClaimedRow, ClaimRequest, Exchange, Outcome
from ..db.storable_outcomes import fail_refused, restore
from ..exceptions import error_summary
from ..states import OutcomeKind, TaskStatus
from ..storable import DEFAULT_MAX_ERROR_BYTES, readable_text
from .connection import close_in_thread, is_pooled, open_in_thread, worker_transaction

logger = logging.getLogger("django_rdbtasks.worker")

#: A Job record's copy of its task's error: as long as a history entry's.
ERROR_LIMIT = DEFAULT_MAX_ERROR_BYTES
#: What ``ClaimStore._parts_written`` says of an outcome whose claim was lost
#: (nothing written, nothing more to write), and of one not in it.
_LOST = object()
_UNSETTLED = object()


def _merge(into: Exchange, part: Exchange) -> None:
    """``part``'s written and busy outcomes into ``into``."""
    into.written.update(part.written)
    into.busy |= part.busy


class ClaimStore:
    def __init__(self, alias: str, database: str, *, prepares: bool | None = None) -> None:
        #: The worker's own connection alias (``connection.worker_alias``),
        #: opened in the thread that makes the store; or, in a test's
        #: in-process drain (``testing``), the test's own alias.
        self.alias = alias
        self.database = database
        #: One dialect per alias and database: the same in every thread.
        self.dialect: Dialect = dialect_for(open_in_thread(alias))
        self.public_id = self.dialect.public_id
        #: Behind a transaction pooler the next statement may run in another
        #: server session: nothing is kept prepared in one. Nor in a session
        #: that is not the worker's own: preparing sets plan settings on it.
        self.prepares = not is_pooled(alias) if prepares is None else prepares
        #: What the parts of a split batch settled, by ``(id, version)``, until
        #: the call that split it returns (``_write_in_parts``).
        self._parts_written: dict[tuple[Any, int], object] = {}

    @property
    def connection(self) -> Any:
        # Looked up in the calling thread: the keeper runs an executor made
        # with the main thread's store (releasing what it hands back).
        return connections[self.alias]

    def close(self) -> None:
        """Drop this thread's connection; the next call reconnects."""
        close_in_thread(self.alias)

    def cursor(self) -> Any:
        return self.dialect.worker_cursor(self.connection, prepare=self.prepares)

    # -- rounds ------------------------------------------------------------------------

    def exchange(
        self, outcomes: Sequence[Outcome], worker_id: str, request: ClaimRequest | None
    ) -> Exchange:
        """Write ``outcomes`` and claim the next rows, in as few round trips as the database allows.

        Every write is fenced by its claim; ``written`` says which went through.

        A round the database refuses for the data of one of its outcomes
        (``database_errors.is_refusal``: it would be refused again however
        often it is tried) committed nothing: its outcomes are then written
        apart, split until each refused one is alone and failed with the
        refusal (``_write_in_parts``), and the claim is made alone after them.
        So no claim is lost or made twice, and the other outcomes go through.
        """
        done, outcomes = self._written_before(outcomes)
        try:
            result = self._exchange(outcomes, worker_id, request)
        except (DatabaseError, UnicodeError) as exc:
            if not outcomes or not is_refusal(exc):
                raise
            self._after_refusal(exc, len(outcomes))
            written = self._write_refusing(outcomes, worker_id)
            result = (
                self._exchange([], worker_id, request)
                if request is not None and request.want > 0
                else Exchange()
            )
            _merge(result, written)
        if done is not None:
            _merge(result, done)
        self._parts_written.clear()
        return result

    def _exchange(
        self, outcomes: Sequence[Outcome], worker_id: str, request: ClaimRequest | None
    ) -> Exchange:
        dialect = self.dialect
        if not dialect.exchange_is_one_statement:
            with worker_transaction(self.alias), self.cursor() as cursor:
                # Follow-ups before the claim: a dependant released here can
                # be claimed in the same round.
                # A hand-over keeps the slots the outcomes would free (claim_after).
                written, busy = dialect.finish_locked(
                    cursor, outcomes, worker_id, release=not dialect.hands_over(request)
                )
                result = Exchange(written, busy=busy)
                self._follow_up(outcomes, result.written, worker_id)
                if request is not None and request.want > 0:
                    dialect.claim_after(cursor, request, result, outcomes)
            result.freed = dialect.limits.freed_unclaimed(outcomes, result)
            self._make_slots(result)
            return result
        # One statement, committed on its own: everything that needs more
        # than the task row (a Job's record, dependants) is finished after it
        # in a transaction of its own, which those tasks' claims still fence.
        quick = [o for o in outcomes if not o.job_name]
        with self.cursor() as cursor:
            result = dialect.exchange(cursor, quick, worker_id, request)
        rest = [o for o in outcomes if o.job_name] + [
            o
            for o in quick
            if o.id not in result.written
            and o.id not in result.busy
            and o.kind in SETTLES_DEPENDANTS
        ]
        if rest:
            # The claims are committed: a refusal here is settled here.
            _merge(result, self._write_refusing(rest, worker_id))
        else:
            self._wake_others(outcomes, result.written)
        self._make_slots(result)
        return result

    def _make_slots(self, result: Exchange) -> None:
        """The slots the round found missing, made now, in a short transaction of their own.

        Never in a user's transaction (an enqueue writes no slot) nor in the
        claim's: what they wait for is at most another worker's same short
        statement. The round's claims are already committed, so a failure
        here is only logged: the next round finds the keys again. Runnable
        rows were left for want of these slots: the round says it was
        contended, so the slot looks again in a few milliseconds.
        """
        if not result.missing:
            return
        result.contended = True
        try:
            with worker_transaction(self.alias), self.connection.cursor() as cursor:
                self.dialect.limits.make_slots(cursor, result.missing)
        except DatabaseError as exc:
            # Galera: another node made them first (a certification conflict).
            level = logging.DEBUG if is_lost_race(exc) else logging.WARNING
            logger.log(level, "Could not make limit slots (%s); the next round tries again.", exc)

    def finish(self, outcomes: Sequence[Outcome], worker_id: str) -> Exchange:
        """Write outcomes with their follow-ups (job records, dependants) in one transaction.

        Outcomes whose rows another session holds locked are left for later
        (``busy``), so the others are written now. Outcomes the database
        refuses are failed one by one, the others written (``exchange``).
        """
        if not outcomes:
            return Exchange()
        done, outcomes = self._written_before(outcomes)
        result = self._write_refusing(outcomes, worker_id) if outcomes else Exchange()
        if done is not None:
            _merge(result, done)
        self._parts_written.clear()
        return result

    # -- what the database refuses -----------------------------------------------------

    def _write_refusing(self, outcomes: Sequence[Outcome], worker_id: str) -> Exchange:
        """``_write``; if the database refuses the batch, ``_write_in_parts``."""
        try:
            return self._write(outcomes, worker_id)
        except (DatabaseError, UnicodeError) as exc:
            if not is_refusal(exc):
                raise
            self._after_refusal(exc, len(outcomes))
            return self._write_in_parts(outcomes, worker_id, exc)

    def _write_in_parts(
        self, outcomes: Sequence[Outcome], worker_id: str, refusal: BaseException
    ) -> Exchange:
        """Write a batch the database refused, split in halves until each refused outcome
        is alone; fail each such outcome with the refusal, write the rest.

        Each part is committed as it is written, and remembered
        (``_parts_written``), so that a batch tried again after an outage in
        the middle writes no outcome twice and reports each once.
        """
        result = Exchange()
        # First part last: the parts are written in the batch's order.
        pending: list[tuple[list[Outcome], BaseException | None]] = [(list(outcomes), refusal)]
        while pending:
            part, refused = pending.pop()
            if refused is None:
                try:
                    written = self._write(part, worker_id)
                except (DatabaseError, UnicodeError) as exc:
                    if not is_refusal(exc):
                        raise
                    self._after_refusal(exc, len(part))
                    refused = exc
                else:
                    self._remember(part, written)
                    _merge(result, written)
                    continue
            if len(part) > 1:
                half = len(part) // 2
                pending += [(part[half:], None), (part[:half], None)]
                continue
            written = self._fail_refused(part[0], refused, worker_id)
            self._remember(part, written)
            _merge(result, written)
        return result

    def _fail_refused(self, outcome: Outcome, refusal: BaseException, worker_id: str) -> Exchange:
        """Write ``outcome``, alone refused, as its task's failure with the refusal (no retry).

        If that is refused too, the refusal was not of the task's data (a
        column or a constraint changed by hand, say): the outcome is put back
        as it was and the error raised, to be retried as any other.
        """
        task_id = self.public_id(outcome.id)
        before = fail_refused(outcome, refusal, worker_id, self._limit_hit(refusal))
        try:
            written = self._write([outcome], worker_id)
        except (DatabaseError, UnicodeError) as exc:
            if is_refusal(exc):
                restore(outcome, before)
                self._after_refusal(exc, 1)
                logger.error(
                    "task %s: the database refuses even its failure (%s): not its data",
                    task_id,
                    describe(exc)[:500],
                )
                raise refusal from exc
            raise
        task_path = outcome.row.task_path if outcome.row is not None else ""
        logger.error("task %s %s failed, not retried: %s", task_id, task_path, outcome.error)
        return written

    def _after_refusal(self, refusal: BaseException, count: int) -> None:
        """A write was refused: drop the connection (MariaDB may have closed it after a
        packet too big; PostgreSQL's is in a failed transaction at worst)."""
        logger.warning(
            "the database refused a write of %d %s (%s); finding whose data it was",
            count,
            "outcome" if count == 1 else "outcomes",
            describe(refusal)[:300],
        )
        self.close()

    def _limit_hit(self, refusal: BaseException) -> str:
        """What the database says of the limit the refusal hit ('' if nothing)."""
        try:
            with self.cursor() as cursor:
                return self.dialect.limit_hit(cursor, refusal) or ""
        except (DatabaseError, UnicodeError):
            self.close()
            return ""

    def _remember(self, part: Sequence[Outcome], written: Exchange) -> None:
        """What a part of a split batch settled: written (with its dependants flag) or lost."""
        for outcome in part:
            if outcome.id in written.written:
                self._parts_written[(outcome.id, outcome.version)] = written.written[outcome.id]
            elif outcome.id not in written.busy:
                self._parts_written[(outcome.id, outcome.version)] = _LOST

    def _written_before(
        self, outcomes: Sequence[Outcome]
    ) -> tuple[Exchange | None, Sequence[Outcome]]:
        """Of a batch tried again after an outage interrupted its split, what the split
        already settled (``_remember``), and the rest to write."""
        if not self._parts_written:
            return None, outcomes  # nearly always: nothing to look up
        done, rest = Exchange(), []
        for outcome in outcomes:
            settled = self._parts_written.get((outcome.id, outcome.version), _UNSETTLED)
            if settled is _UNSETTLED:
                rest.append(outcome)
            elif settled is not _LOST:
                done.written[outcome.id] = settled  # type: ignore[assignment]
        return done, rest

    def _write(self, outcomes: Sequence[Outcome], worker_id: str) -> Exchange:
        """Outcomes with their follow-ups in one transaction (see ``finish``)."""
        if not outcomes:
            return Exchange()
        with worker_transaction(self.alias), self.cursor() as cursor:
            written, busy = self.dialect.finish_locked(cursor, outcomes, worker_id)
            self._follow_up(outcomes, written, worker_id)
            self._wake_others(outcomes, written)
        return Exchange(written, busy=busy)

    def _wake_others(self, outcomes: Sequence[Outcome], written: dict[Any, bool | None]) -> None:
        """Tasks given back unstarted are runnable now: wake idle workers (PostgreSQL)."""
        # Each claimed before (``started_at`` set): deferred rows, which no
        # frontier passes (db/frontier.py); their pairs wake without a read
        # from the head.
        pairs = {
            (o.row.queue_name, o.row.priority)
            for o in outcomes
            if o.kind == OutcomeKind.RELEASE and o.row is not None and o.id in written
        }
        if pairs:
            with self.cursor() as cursor:
                self.dialect.notify_ready(cursor, pairs)

    def _follow_up(
        self, outcomes: Sequence[Outcome], written: dict[Any, bool | None], worker_id: str
    ) -> None:
        self._update_job_records(outcomes, written, worker_id)
        self._settle_dependants(outcomes, written)

    def _update_job_records(
        self, outcomes: Sequence[Outcome], written: dict[Any, bool | None], worker_id: str
    ) -> None:
        """A Job's record follows its task, in the transaction that ends the attempt."""
        from ..models import JobRecord

        for outcome in outcomes:
            row = outcome.row
            status = outcome.kind.status
            if (
                row is None
                or not row.job_name
                or outcome.id not in written
                or status is None
                or outcome.kind == OutcomeKind.RELEASE
            ):
                continue
            duration = timedelta(seconds=outcome.duration)
            error = outcome.error
            JobRecord.objects.using(self.alias).filter(
                task_id=self.public_id(row.id), job_name=row.job_name
            ).update(
                status=status,
                started_at=row.started_at,
                finished_at=row.claimed_at + duration,
                duration=duration,
                worker_id=worker_id,
                # The error's text as every database stores it (storable.py).
                error="" if error is None else readable_text(error_summary(error), ERROR_LIMIT),
            )

    def _settle_dependants(
        self, outcomes: Sequence[Outcome], written: dict[Any, bool | None]
    ) -> None:
        """Release or end the dependants of what just finished, and move its workflows on,
        in the same transaction."""
        from ..sagas import settle_finished

        succeeded, failed = [], []
        for outcome in outcomes:
            if written.get(outcome.id, False) is False:
                continue  # not written, or known to have no dependants
            if outcome.kind == OutcomeKind.SUCCESS:
                succeeded.append(self.public_id(outcome.id))
            elif outcome.kind in SETTLES_DEPENDANTS:
                failed.append(self.public_id(outcome.id))
        if succeeded or failed:
            settle_finished(self.alias, succeeded, failed)

    # -- while a task runs -------------------------------------------------------------

    def renew(
        self,
        held: Sequence[tuple[Any, int]],
        worker_id: str,
        lease: float,
        limited: Collection[Any] | None = None,
    ) -> tuple[set[Any], set[Any]]:
        """Extend our leases: the ids still ours, and those an operator asked to cancel.

        ``limited``: the ids of the claims that hold a limit's slot (None: any may).
        """
        if self.dialect.exchange_is_one_statement:
            with self.cursor() as cursor:
                return self.dialect.renew(cursor, held, worker_id, lease, limited)
        # Several statements: the rows locked first stay locked for the update.
        with worker_transaction(self.alias), self.cursor() as cursor:
            return self.dialect.renew(cursor, held, worker_id, lease, limited)

    def save_progress(
        self,
        row: ClaimedRow,
        worker_id: str,
        *,
        progress: float | None,
        message: str,
        checkpoint: Any,
        checkpoint_changed: bool,
    ) -> bool:
        """Write a running task's progress (and checkpoint), fenced; False if no longer ours.

        A write the database refuses is raised (the runner fails the task), its
        connection dropped first: MariaDB may have closed it.
        """
        try:
            with self.cursor() as cursor:
                return self.dialect.save_progress(
                    cursor,
                    row.id,
                    row.version,
                    worker_id,
                    progress=progress,
                    message=message,
                    checkpoint_json=json.dumps(checkpoint) if checkpoint_changed else None,
                )
        except (DatabaseError, UnicodeError) as exc:
            if is_refusal(exc):
                self.close()
            raise

    def note_lost_attempt(self, row: ClaimedRow, worker_id: str, entry: dict) -> bool:
        """Record a previous holder's lost attempt in the history; the claim is kept."""
        outcome = Outcome(row.id, row.version, OutcomeKind.NOTE, entry=entry, row=row)
        with self.cursor() as cursor:
            return bool(self.dialect.finish(cursor, [outcome], worker_id))

    def unlimited_waiting(self, queues: Sequence[str]) -> bool:
        """Whether a row without a limit is runnable in these queues
        (``Dialect.unlimited_waiting``)."""
        with self.cursor() as cursor:
            return self.dialect.unlimited_waiting(cursor, queues)

    def held_back_by_limits(self, queues: Sequence[str]) -> bool:
        """Burst mode: due tasks of these queues wait for a limit's slot (not drained yet)."""
        from ..db.functions import DbNow
        from ..models import Task

        return (
            Task.objects.using(self.alias)
            .filter(status=TaskStatus.READY, queue_name__in=queues, run_after__lte=DbNow())
            .exclude(limit_key=None)
            .exists()
        )

    def ready_among(self, ids: Iterable[Any]) -> set[str]:
        """Public ids of those of these tasks that are READY (waiting out a retry, say)."""
        from ..models import Task

        wanted = [self.dialect.decode_id(i) for i in ids]
        if not wanted:
            return set()
        found = Task.objects.using(self.alias).among(wanted, TaskStatus.READY)
        return {str(pk) for pk in found.values_list("pk", flat=True)}
