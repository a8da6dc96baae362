"""The statements of cluster-wide limits: slots taken at claim, freed at outcome.

A limited task's row names its key, the key's slot count and a period (0 for
a concurrency limit). The key has that many ``LimitSlot`` rows, made by the
workers: the enqueue writes its own rows only, and a claim that finds rows of
a key whose slots are missing (or fewer than its count) leaves them READY,
reports the key, and its worker makes the slots in a statement of its own
(``make_slots``); the next round claims. A claim takes a free slot for each
limited row it claims, in the claim's transaction, and only under the slot
row's own lock:

- a slot is free when its ``free_at`` is NULL or past (database clock): the
  decision reads nothing but the slot row, so two claimers can never both
  take it (PostgreSQL re-checks a locked row's own columns at its newest
  version; InnoDB's locking reads read the newest version; SQLite has one
  writer; on Galera the second commit fails certification and is retried);
- a concurrency slot's ``free_at`` is its holder's lease: renewed with it,
  cleared by the holder's outcome (fenced on the claim's task id and
  version), and past when a dead holder's lease lapsed;
- a rate slot's ``free_at`` is its last start plus the period, so two starts
  on one slot are a period apart and any window of a period holds at most
  N starts of the key.

The candidate reads offer a key's rows only as far as it has free slots, so a
full key costs no claim, no attempt and no write; a claim that loses the race
for a key's last slot leaves its row READY and untouched. PostgreSQL takes the
slots in its one-statement round (``postgresql/round.py``); this module is the
portable form, used by MySQL/MariaDB and SQLite (with ``ready_reads.py``),
and the enqueue's part everywhere.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from ..states import OutcomeKind
from .rows import Candidate, ClaimedRow, Exchange, NewTask, Outcome
from .spelling import Spelling


class LimitSQL:
    def __init__(self, dialect: Spelling) -> None:
        self.dialect = dialect
        self.table = dialect.limit_slot_table
        self.free_sql = self.free("s")

    def free(self, alias: str) -> str:
        """A slot free now: its own columns decide, nothing else."""
        return f"({alias}.free_at IS NULL OR {alias}.free_at <= {self.dialect.now_sql})"

    def available(self, task: str) -> str:
        """The task row (``task``: its table or alias) is unlimited or its key has a free slot.

        A filter of the candidate reads, evaluated row by row on the rows the
        index range yields: a probe of the slot index, at most N rows.
        """
        return (
            f"({task}.limit_key IS NULL OR EXISTS (SELECT 1 FROM {self.table} s "
            f"WHERE s.{self._key} = {task}.limit_key AND s.slot_no < {task}.limit_count "
            f"AND {self.free_sql}))"
        )

    @property
    def _key(self) -> str:
        return self.dialect.connection.ops.quote_name("key")

    # -- enqueue -------------------------------------------------------------------------

    def attach(self, cursor: Any, tasks: Sequence[NewTask]) -> None:
        """Store each new row's limit, in the enqueue's transaction.

        Only the new rows are written: no slot, nothing another enqueue could
        be writing too, so an enqueue never waits on another transaction. A
        key's slots are made by the workers (``make_slots``).
        """
        by_spec: dict[tuple[str, int, float], list[Any]] = {}
        for task in tasks:
            spec = (task.limit.key, task.limit.count, task.limit.period)
            by_spec.setdefault(spec, []).append(self.dialect.encode_id(task.id))
        for spec, ids in sorted(by_spec.items()):
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                cursor.execute(
                    f"UPDATE {self.dialect.table} SET limit_key = %s, limit_count = %s, "
                    f"limit_period = %s WHERE id IN ({', '.join(['%s'] * len(chunk))})",
                    [*spec, *chunk],
                )

    # -- slots made by the workers ---------------------------------------------------------

    def make_slots(self, cursor: Any, missing: Sequence[tuple[str, int, float]]) -> None:
        """Make the keys' slots ``0 .. count - 1`` that do not exist yet, in one statement.

        Run by a worker whose claim found rows of these keys and not all their
        slots (a new key, a raised limit, slots deleted), in a transaction of
        its own: two workers making the same key's slots wait at most for the
        other's one statement, never on a user's transaction. Keys sorted, so
        two such statements take their index locks in one order. A slot is
        its ``(key, slot_no)``, unique: however many make it, there is one.
        """
        rows = [
            (key, slot, period)
            for key, count, period in sorted(set(missing))
            for slot in range(count)
        ]
        for start in range(0, len(rows), 1000):
            chunk = rows[start : start + 1000]
            cursor.execute(
                self.dialect.insert_ignore_sql.format(
                    table=self.table,
                    columns=f"{self._key}, slot_no, period",
                    values=", ".join(["(%s, %s, %s)"] * len(chunk)),
                ),
                [value for row in chunk for value in row],
            )

    def slot_state(
        self, cursor: Any, counts: dict[str, int]
    ) -> dict[str, tuple[int, int, float | None]]:
        """Per key: how many of its slots below its count exist, how many are free
        now, and the seconds until the first of the others comes free by time
        (a rate window's end, a lapsing lease; None if none is busy), by the
        database's clock.

        Reads at most ``count`` slot rows a key, by the ``(key, slot_no)`` index.
        """
        found: dict[str, list[tuple[int, bool, Any, Any]]] = {key: [] for key in counts}
        keys = sorted(counts)
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            cursor.execute(
                f"SELECT s.{self._key}, s.slot_no, CASE WHEN {self.free_sql} THEN 1 ELSE 0 END, "
                f"s.free_at, {self.dialect.now_sql} "
                f"FROM {self.table} s WHERE s.{self._key} IN ({', '.join(['%s'] * len(chunk))})",
                chunk,
            )
            for key, slot_no, free, free_at, now in cursor.fetchall():
                if slot_no < counts[key]:
                    found[key].append((slot_no, bool(free), free_at, now))
        state: dict[str, tuple[int, int, float | None]] = {}
        for key, slots in found.items():
            waits = [
                self._seconds_between(now, free_at)
                for _, free, free_at, now in slots
                if not free and free_at is not None
            ]
            free_now = sum(free for _, free, _, _ in slots)
            state[key] = (len(slots), free_now, min(waits, default=None))
        return state

    def _seconds_between(self, start: Any, end: Any) -> float:
        """``end - start`` in seconds, both as the driver returned a DateTimeField."""
        decode = self.dialect.decode_dt
        first, last = decode(start), decode(end)
        assert first is not None and last is not None
        return (last - first).total_seconds()

    # -- claim (MySQL/MariaDB, SQLite) -----------------------------------------------------

    def take_in_order(
        self, cursor: Any, rows: Sequence[Candidate], want: int
    ) -> tuple[list[Candidate], dict[str, list[Any]], int]:
        """Of ``rows`` (in claim order), those that may be claimed, their slots locked.

        Walked in order until ``want`` may be claimed: an unlimited row may,
        and a limited one if its key has a free slot, locked here (skipping
        slots another session holds; a key's slots in one statement, as many
        as its rows still to come need). A limited row that finds none is
        passed over and the rows behind it fill the batch in its place; it
        stays READY. The unlimited rows after the batch is full are kept as
        spares, for rows the compare-and-set loses. Returns those rows, each
        key's slots locked (primary keys, in slot order), and how many limited
        rows found no slot.
        """
        lock = self.dialect.row_lock_sql if self.dialect.has_row_locks else ""
        usable: list[Candidate] = []
        slots: dict[str, list[Any]] = {}
        used: dict[str, int] = {}
        lost = 0
        for i, c in enumerate(rows):
            key = c.limit_key
            if key is None:
                usable.append(c)
                continue
            if len(usable) >= want:
                continue
            if key not in slots:
                rest = [r for r in rows[i:] if r.limit_key == key]
                cursor.execute(
                    f"SELECT id FROM {self.table} s WHERE s.{self._key} = %s AND s.slot_no < %s "
                    f"AND {self.free_sql} ORDER BY s.slot_no LIMIT %s {lock}",
                    [key, max(r.limit_count or 0 for r in rest), min(len(rest), want)],
                )
                slots[key] = [slot_id for (slot_id,) in cursor.fetchall()]
            if used.get(key, 0) < len(slots[key]):
                used[key] = used.get(key, 0) + 1
                usable.append(c)
            else:
                lost += 1
        return usable, slots, lost

    def hand_over(self, cursor: Any, holder: tuple[Any, int], to: Candidate, lease: float) -> bool:
        """The concurrency slot of ``holder`` (a claim whose outcome this transaction
        wrote, its slot not freed) given to ``to``'s claim, about to be made
        (``version + 1``), in one write: only if ``holder`` still holds it (a slot
        taken by another claimer after ``holder``'s lease lapsed is not its to
        give) and it is among ``to``'s limit's slots (a limit lowered since).
        Whether it was."""
        now = self.dialect.now_sql
        cursor.execute(
            f"UPDATE {self.table} SET holder_id = %s, holder_version = %s, "
            f"last_started_at = {now}, free_at = {self.dialect.now_plus_sql('%s')} "
            "WHERE holder_id = %s AND holder_version = %s AND slot_no < %s",
            [
                to.id,
                to.version + 1,
                self.dialect.seconds_param(lease),
                holder[0],
                holder[1],
                to.limit_count or 0,
            ],
        )
        return cursor.rowcount == 1

    @staticmethod
    def assign(chosen: Sequence[Candidate], slots: dict[str, list[Any]]) -> dict[Any, Any]:
        """The slot each limited row of ``chosen`` takes: a key's n-th row, its n-th slot."""
        given: dict[str, int] = {}
        assigned = {}
        for c in chosen:
            if c.limit_key is not None:
                n = given.get(c.limit_key, 0)
                assigned[c.id] = slots[c.limit_key][n]
                given[c.limit_key] = n + 1
        return assigned

    def freed_unclaimed(self, outcomes: Sequence[Outcome], result: Exchange) -> int:
        """Concurrency slots these outcomes freed (those written) that the same
        transaction's claim (``result.claimed``) did not take back for their keys."""
        freed: dict[str, int] = {}
        for o in outcomes:
            if o.frees_slot and o.id in result.written and o.row is not None:
                key = o.row.limit_key
                assert key is not None
                freed[key] = freed.get(key, 0) + 1
        for claimed in result.claimed:
            if claimed.limit_key in freed:
                freed[claimed.limit_key] -= 1
        return sum(n for n in freed.values() if n > 0)

    def stamp(
        self,
        cursor: Any,
        claimed: Sequence[ClaimedRow],
        chosen: Sequence[Candidate],
        slots: dict,
        lease: float,
        start_within: float,
    ) -> None:
        """Mark the slots of the rows just claimed: from the claim's own database time.

        ``free_at`` is the claim's ``last_attempted_at`` plus the lease (a
        concurrency slot, renewed with the lease) or the period and the time
        its worker has to start the body (a rate slot: ``start_within``,
        ``ClaimRequest``), so the next start on the slot is a whole period
        after this one, however late within its time this one starts.
        """
        if not slots:
            return
        by_id = {c.id: c for c in chosen}
        adapt = self.dialect.connection.ops.adapt_datetimefield_value
        params = []
        for row in claimed:
            slot_id = slots.get(row.id)
            if slot_id is None:
                continue
            period = by_id[row.id].limit_period or 0.0
            concurrency = period <= 0
            seconds = lease if concurrency else period + start_within
            free_at = row.claimed_at + dt.timedelta(seconds=seconds)
            params.append(
                [
                    row.id if concurrency else None,
                    row.version if concurrency else None,
                    adapt(row.claimed_at),
                    adapt(free_at),
                    slot_id,
                ]
            )
        if params:
            cursor.executemany(
                f"UPDATE {self.table} SET holder_id = %s, holder_version = %s, "
                "last_started_at = %s, free_at = %s WHERE id = %s",
                params,
            )

    # -- outcomes and leases -------------------------------------------------------------

    @staticmethod
    def ended(outcomes: Sequence[Outcome]) -> list[tuple[Any, int]]:
        """The limited claims these outcomes end (a NOTE keeps its claim)."""
        return [(o.id, o.version) for o in outcomes if o.kind != OutcomeKind.NOTE and o.limited]

    def _holders(self, claims: Sequence[tuple[Any, int]]) -> tuple[str, list[Any]]:
        marks = ", ".join(["%s"] * len(claims))
        matches = " OR ".join(["(holder_id = %s AND holder_version = %s)"] * len(claims))
        params: list[Any] = [i for i, _ in claims]
        for i, v in claims:
            params += [i, v]
        return f"holder_id IN ({marks}) AND ({matches})", params

    def release(self, cursor: Any, outcomes: Sequence[Outcome]) -> None:
        """Free the concurrency slots of the claims these outcomes, just written, ended.

        Only once written: an outcome left for later leaves its task RUNNING,
        and counted, till then. A claim lost to a takeover is never written
        and needs no release: its slot's ``free_at`` lapsed with its lease. A
        slot taken since by another claim has another holder and is left alone.
        """
        self.release_claims(cursor, sorted(self.ended(outcomes)))

    def release_claims(self, cursor: Any, claims: Sequence[tuple[Any, int]]) -> None:
        """Free the concurrency slots these claims (id, version) hold, if any."""
        if not claims:
            return
        where, params = self._holders(claims)
        cursor.execute(
            f"UPDATE {self.table} SET free_at = NULL, holder_id = NULL, holder_version = NULL "
            f"WHERE {where}",
            params,
        )

    def renew(self, cursor: Any, claims: Sequence[tuple[Any, int]], lease: float) -> None:
        """Extend the slots of claims whose leases were just renewed, to the same time."""
        if not claims:
            return
        where, params = self._holders(sorted(claims))
        cursor.execute(
            f"UPDATE {self.table} SET free_at = {self.dialect.now_plus_sql('%s')} WHERE {where}",
            [self.dialect.seconds_param(lease), *params],
        )
