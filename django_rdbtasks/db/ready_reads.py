"""The portable claim's reads of runnable rows, limits and all (MySQL/MariaDB, SQLite).

What PostgreSQL does in one statement (``postgresql/round.py``), in a few:

1. One read per queue and kind, each a range of its index in the index's
   order with a LIMIT: the expired leases (those of a limited task only where
   its key has a free slot), the READY rows without a limit, and a *window*
   of READY rows with one. Where the database has partial indexes these are
   indexes apart (``rdbtasks_task_ready_fresh`` and ``_deferred`` without a
   limit, each read on its own, and ``_limited``: ``ready_arms``); MySQL and
   MariaDB have none, so there the window is the first READY rows of any
   kind (``rdbtasks_task_ready``) and the unlimited read comes only when
   needed (step 3), by ``limit_key IS NULL`` on ``rdbtasks_task_ready_key``.
2. The slots of the window's keys (``LimitSQL.slot_state``): a key's rows are
   offered as far as it has free slots; keys missing slots are reported.
3. Only where a queue's window was full yet offered fewer rows than wanted (a
   full key's backlog fills it): its keys are walked, one look-up of the
   next key each (a loose index scan; MySQL and MariaDB do not run one as a
   recursive query, so it is a loop of short statements), and each key with
   free slots is read for as many rows as it has. The cost is then per key
   with READY rows in the queue, never per row of a backlog. The keys a
   walk found serve the process's next walks of the queue for
   ``KEYS_KEPT_SECONDS`` (``WalkedKeys``); their slots are read every time.

The rows are then ordered as the claim orders them: expired leases first,
then priority and ``run_after``, limited or not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..states import TaskStatus
from . import ready_arms
from .claim_order import ready_order, sort_key
from .limits import LimitSQL
from .rows import (
    CANDIDATE_COLUMNS,
    CLAIM_COLUMNS,
    CLAIMABLE_COLUMNS,
    Candidate,
    Claimable,
    Exchange,
)
from .spelling import Spelling

READY, RUNNING = TaskStatus.READY.value, TaskStatus.RUNNING.value
#: Parts of the first read: where the database has partial indexes, the READY
#: rows without a limit are two parts, fresh and deferred (``ready_arms``).
EXPIRED, FRESH, DEFERRED, WINDOW = "expired", "fresh", "deferred", "window"
#: How long the keys a walk found serve the next walks of the queue in the
#: same process. Each walk is a statement a key (MySQL and MariaDB run no
#: loose index scan as one), and while full keys' backlogs fill the windows
#: every round walks: issue 42's scenario made six of the 26 statements of
#: each MariaDB round. The keys change only as backlogs begin and end, and
#: what is kept is the list, never the slots (read every walk), so a slot
#: that comes free is seen at the next round as before. What waits longer:
#: a key new to the queue, whose first rows lie behind the window and no
#: kept walk knows, is found by the next walk, this much later at most.
KEYS_KEPT_SECONDS = 0.25
#: At most this many kept keys have their slots read with the window's
#: (``ReadyReads.read``): a round that does not walk reads them for nothing,
#: and a queue of thousands of keys would pay that at every round.
KEPT_SLOTS_READ_AHEAD = 100


@dataclass(slots=True)
class _Row:
    candidate: Candidate
    order: tuple
    #: The read's columns after the candidate's: ``reclaim``, ``priority``, ``run_after``
    #: as read, then any more (``ReadyReads.next_of_keys``'s ``whole``).
    rest: tuple = ()


@dataclass(slots=True)
class Held:
    """What a read found of limits: keys missing slots, keys that held rows back."""

    missing: list[tuple[str, int, float]] = field(default_factory=list)
    #: Keys with no free slot for rows of theirs the read found.
    keys: set[str] = field(default_factory=set)
    #: Seconds until the first slot of those keys comes free by time (None: none will).
    wait: float | None = None

    def add(self, key: str, wait: float | None) -> None:
        self.keys.add(key)
        if wait is not None and (self.wait is None or wait < self.wait):
            self.wait = max(0.0, wait)


class WalkedKeys:
    """The keys with READY rows a queue's walk found (``ReadyReads._walk``), each
    with its limit's count and period, kept for ``KEYS_KEPT_SECONDS``.

    One per dialect, that is per process and database: the process's round
    threads share it (hence the lock).
    """

    def __init__(self, kept: float = KEYS_KEPT_SECONDS) -> None:
        self.kept = kept
        self._lock = threading.Lock()
        self._found: dict[str, tuple[float, dict[str, tuple[int, float]]]] = {}

    def get(self, queue: str, seen: Collection[str] = ()) -> dict[str, tuple[int, float]] | None:
        """The keys kept for ``queue``, if still fresh and none of ``seen`` (the keys
        of the round's window) is missing from them."""
        with self._lock:
            entry = self._found.get(queue)
        if entry is None or time.monotonic() - entry[0] > self.kept:
            return None
        heads = entry[1]
        return heads if all(key in heads for key in seen) else None

    def put(self, queue: str, heads: dict[str, tuple[int, float]]) -> None:
        with self._lock:
            self._found[queue] = (time.monotonic(), heads)

    def clear(self) -> None:
        with self._lock:
            self._found.clear()


class ReadyReads:
    def __init__(self, dialect: Spelling, limits: LimitSQL) -> None:
        self.d = dialect
        self.limits = limits
        self.walked = WalkedKeys()
        self.t = dialect.table
        #: READY rows with and without a limit are in indexes apart.
        self.split = dialect.connection.features.supports_partial_indexes
        self.cols = ", ".join(CANDIDATE_COLUMNS)

    # -- the statements ----------------------------------------------------------------

    def _select(
        self, where: str, order: str, reclaim: int, tag: int | None = None, more: str = ""
    ) -> str:
        tagged = "" if tag is None else f", {tag} AS part"
        return (
            f"SELECT {self.cols}, {reclaim} AS reclaim, priority, run_after{tagged}{more} "
            f"FROM {self.t} AS t WHERE {where} ORDER BY {order} LIMIT %s"
        )

    def part_sql(self, kind: str, tag: int | None = None) -> str:
        """One part of the first read, for one queue (parameters: the queue, the limit);
        ``tag``: a column ``part`` more, of that value."""
        now = self.d.now_sql
        if kind == EXPIRED:
            # A limited task's only where its key has a free slot.
            return self.expired_sql(self.limits.available("t"), tag)
        arm = {FRESH: ready_arms.FRESH, DEFERRED: ready_arms.DEFERRED, WINDOW: ""}[kind]
        if kind == WINDOW and self.split:
            arm = ready_arms.LIMITED
        limit = f"AND {arm} " if arm else ""
        return self._select(
            f"status = '{READY}' AND queue_name = %s {limit}AND run_after <= {now}",
            ready_order(),
            1,
            tag,
        )

    def parts(self, queues: Sequence[str]) -> list[tuple[str, int]]:
        kinds = [EXPIRED, FRESH, DEFERRED, WINDOW] if self.split else [EXPIRED, WINDOW]
        return [(kind, i) for kind in kinds for i in range(len(queues))]

    def first_sql(self, queues: Sequence[str], lock: str = "") -> str:
        """The first read, all parts in one statement, each part tagged by its number.

        ``lock``: a locking clause each part takes its rows with, in a
        parenthesized part (where the database allows it: ``locks_in_union``,
        MySQL and MariaDB; SQLite takes no row lock, and allows no
        parenthesized part).
        """
        parts = list(enumerate(self.parts(queues)))
        if lock:
            return " UNION ALL ".join(
                f"({self.part_sql(kind, tag=n)} {lock})" for n, (kind, _) in parts
            )
        return " UNION ALL ".join(
            f"SELECT p{n}.*, {n} AS part FROM ({self.part_sql(kind)}) AS p{n}"
            for n, (kind, _) in parts
        )

    def first_params(self, queues: Sequence[str], limit: int) -> list[Any]:
        return [v for _, i in self.parts(queues) for v in (queues[i], limit)]

    # -- reading -----------------------------------------------------------------------

    def _row(self, raw: Sequence[Any]) -> _Row:
        n = len(CANDIDATE_COLUMNS)
        candidate = self.d.decode_candidate(raw[:n])
        reclaim, priority, run_after = raw[n : n + 3]
        return _Row(
            candidate,
            sort_key(reclaim, priority, self.d.decode_dt(run_after)),
            tuple(raw[n:]),
        )

    def _run(self, cursor: Any, sql: str, params: list[Any], lock: str) -> list[_Row]:
        cursor.execute(f"{sql} {lock}" if lock else sql, params)
        return [self._row(raw) for raw in cursor.fetchall()]

    def read(
        self,
        cursor: Any,
        queues: Sequence[str],
        limit: int,
        *,
        lock: str = "",
        report: Exchange | None = None,
    ) -> list[Candidate]:
        """Up to ``limit`` runnable rows of ``queues``, in claim order.

        ``lock``: a locking clause (``FOR UPDATE SKIP LOCKED``) each read
        takes its rows with; rows read and not returned stay locked until the
        caller's transaction ends. ``report``: keys whose slots are missing
        are added to its ``missing``, as ``(key, count, period)``; whether
        keys with no free slot held rows back, and how long until the first of
        their slots comes free by time, to its ``held`` and ``wait``.
        """
        parts = self.parts(queues)
        read: list[list[_Row]] = [[] for _ in parts]
        if lock and not self.d.locks_in_union:
            # (PostgreSQL's portable claim, which only tests run: its worker
            # claims in its round.) Locking reads one by one; the expired
            # leases come first, and may be all a round takes.
            expired = 0
            for n, (kind, i) in enumerate(parts):
                if kind != EXPIRED and expired >= limit:
                    break
                read[n] = self._run(cursor, self.part_sql(kind), [queues[i], limit], lock)
                expired += len(read[n]) if kind == EXPIRED else 0
        else:
            # One statement, locking or not: a locking one also locks the
            # READY rows of a round that expired leases fill (rows others
            # skip until this round commits, as they skip the rows read
            # beyond its batch), where a statement a part cost two a queue
            # (issue 42 on MariaDB).
            cursor.execute(self.first_sql(queues, lock), self.first_params(queues, limit))
            for raw in cursor.fetchall():
                read[raw[-1]].append(self._row(raw[:-1]))
        found: list[_Row] = []
        windows: dict[int, list[_Row]] = {}
        for n, (kind, i) in enumerate(parts):
            if kind == WINDOW:
                windows[i] = read[n]
            else:
                found += read[n]
        held = Held()
        # The keys a kept walk knows have their slots read with the window's: a
        # round that walks then reads no slot again (one statement less).
        kept: dict[str, int] = {}
        for i in windows:
            for key, (count, _) in (self.walked.get(queues[i]) or {}).items():
                kept[key] = max(kept.get(key, 0), count)
        if len(kept) > KEPT_SLOTS_READ_AHEAD:
            kept = {}
        offered, walk, state = self._offer(cursor, windows, limit, held, kept)
        for i in windows:
            if i in walk:
                keys = {c.limit_key for c in (r.candidate for r in windows[i]) if c.limit_key}
                found += self._walk(cursor, queues[i], limit, lock, held, keys, state)
            else:
                found += offered[i]
        if report is not None:
            report.missing += held.missing
            report.held, report.wait = bool(held.keys), held.wait
        seen: set[Any] = set()
        rows = []
        for row in sorted(found, key=lambda r: r.order):
            if row.candidate.id not in seen:
                seen.add(row.candidate.id)
                rows.append(row.candidate)
        return rows[:limit]

    def read_unlimited(
        self, cursor: Any, queues: Sequence[str], limit: int, *, lock: str = ""
    ) -> list[Candidate]:
        """Up to ``limit`` runnable rows of ``queues`` without a limit, in claim order:
        a claim ahead of a running task (``ClaimRequest.ahead``), which takes no
        limited row. No slot is read, no key walked: per queue its expired
        leases without a limit and its READY rows without one, each a range of
        an index with a LIMIT."""
        parts: list[tuple[str, list[Any]]] = []
        for queue in queues:
            parts.append((self.expired_sql("limit_key IS NULL"), [queue, limit]))
            if self.split:
                parts += [(self.part_sql(kind), [queue, limit]) for kind in (FRESH, DEFERRED)]
            else:
                parts.append((self.unlimited_sql(), [queue, limit]))
        found = sorted(self._read_parts(cursor, parts, lock), key=lambda r: r.order)
        return [r.candidate for r in found[:limit]]

    def next_of_keys(
        self, cursor: Any, keys: Sequence[tuple[str, str]], *, lock: str = "", whole: bool = False
    ) -> list[Candidate]:
        """The hand-over's read (``Dialect.hand_over_into``): each ``(queue, key)``'s
        next READY row under a concurrency limit, due, of a queue not paused, in
        the key's own order: one look-up of ``rdbtasks_task_ready_key`` a key,
        whatever its backlog.

        ``whole``: each a ``Claimable``, read with the rest of its claim's columns
        and the database's time (``Dialect.claims_from_read``)."""
        where = (
            f"status = '{READY}' AND queue_name = %s AND limit_key = %s "
            f"AND COALESCE(limit_period, 0) <= 0 AND run_after <= {self.d.now_sql} "
            f"AND NOT EXISTS (SELECT 1 FROM {self.d.paused_table} AS p "
            "WHERE p.queue_name = t.queue_name)"
        )
        more = f", {', '.join(CLAIMABLE_COLUMNS)}, {self.d.now_sql} AS read_at" if whole else ""
        parts = [
            (self._select(where, ready_order(), 1, more=more), [queue, key, 1])
            for queue, key in keys
        ]
        found = sorted(self._read_parts(cursor, parts, lock), key=lambda r: r.order)
        if not whole:
            return [r.candidate for r in found]
        return [self._claimable(r) for r in found]

    def _claimable(self, row: _Row) -> Claimable:
        c = row.candidate
        _, priority, run_after, *more, read_at = row.rest
        # The read's columns by name: the candidate's, the order's, then ``more``'s
        # (``last_attempted_at`` is the claim's: ``Claimable.claimed``).
        read = {
            "id": c.id,
            "version": c.version,
            "last_attempted_at": None,
            "limit_key": c.limit_key,
            "limit_period": c.limit_period,
            "priority": priority,
            "run_after": run_after,
            **dict(zip(CLAIMABLE_COLUMNS, more, strict=True)),
        }
        return Claimable(
            c.id,
            c.version,
            c.status,
            c.worker_id,
            c.last_attempted_at,
            c.limit_key,
            c.limit_count,
            c.limit_period,
            values=tuple(read[column] for column in CLAIM_COLUMNS),
            read_at=read_at,
        )

    def expired_sql(self, condition: str, tag: int | None = None) -> str:
        """A queue's expired leases that meet ``condition`` (``%s``: the queue, how many)."""
        return self._select(
            f"status = '{RUNNING}' AND queue_name = %s AND lease_expires_at <= "
            f"{self.d.now_sql} AND {condition}",
            "lease_expires_at",
            0,
            tag,
        )

    def _offer(
        self,
        cursor: Any,
        windows: dict[int, list[_Row]],
        limit: int,
        held: Held,
        also: dict[str, int] | None = None,
    ) -> tuple[dict[int, list[_Row]], set[int], dict[str, tuple[int, int, float | None]]]:
        """The window rows each queue may claim, the queues whose keys must be walked,
        and the slots' state read (``LimitSQL.slot_state``).

        A key's rows are offered as far as it has free slots (so a key with
        one free slot does not fill a window either). Rows without a limit
        (MySQL's windows hold both) are always offered. ``also``: more keys
        (with their counts) whose slots to read in the same statement.
        """
        counts: dict[str, int] = {}
        periods: dict[str, float] = {}
        for rows in windows.values():
            for r in rows:
                c = r.candidate
                if c.limit_key is not None:
                    counts[c.limit_key] = max(counts.get(c.limit_key, 0), c.limit_count or 0)
                    periods[c.limit_key] = c.limit_period or 0.0
        # (A window without limited rows offers every row: no walk follows.)
        asked = dict(also or {}) if counts else {}
        for limited, count in counts.items():
            asked[limited] = max(asked.get(limited, 0), count)
        state = self.limits.slot_state(cursor, asked) if asked else {}
        self._report(state, counts, periods, held)
        left = {key: state[key][1] for key in counts}
        offered: dict[int, list[_Row]] = {}
        walk: set[int] = set()
        for i, rows in windows.items():
            offered[i] = []
            for r in rows:
                key = r.candidate.limit_key
                if key is None or left[key] > 0:
                    offered[i].append(r)
                    if key is not None:
                        left[key] -= 1
                else:
                    held.add(key, state[key][2])
            if len(rows) >= limit and len(offered[i]) < limit:
                walk.add(i)
        return offered, walk, state

    @staticmethod
    def _report(
        state: dict[str, tuple[int, int, float | None]],
        counts: dict[str, int],
        periods: dict[str, float],
        held: Held,
    ) -> None:
        for key, count in counts.items():
            if state[key][0] < count:
                held.missing.append((key, count, periods[key]))

    # -- the walk's statements (step 3 of the module's docstring) ---------------------------

    #: A queue's READY rows with a limit (``%s``: the queue), before what follows it.
    _KEYED = f"status = '{READY}' AND queue_name = %s AND limit_key"

    def first_key_sql(self) -> str:
        """The first key of a queue with READY rows (``%s``: the queue): its first row
        in the ``ready_key`` index, one descent."""
        return (
            f"SELECT limit_key, limit_count, limit_period FROM {self.t} "
            f"WHERE {self._KEYED} IS NOT NULL ORDER BY {ready_order(after=['limit_key'])} LIMIT 1"
        )

    def next_key_sql(self) -> str:
        """The next key after one (``%s``: the queue, the key): one descent a key,
        however many rows the key before it holds (a loose index scan, step by step)."""
        return (
            f"SELECT limit_key, limit_count, limit_period FROM {self.t} "
            f"WHERE {self._KEYED} > %s ORDER BY {ready_order(after=['limit_key'])} LIMIT 1"
        )

    def key_rows_sql(self) -> str:
        """A key's runnable rows in claim order (``%s``: the queue, the key, how many)."""
        where = f"{self._KEYED} = %s AND run_after <= {self.d.now_sql}"
        return self._select(where, ready_order(), 1)

    def unlimited_sql(self) -> str:
        """Where the window holds every kind (no partial indexes: MySQL, MariaDB), the
        rows without a limit of a walked queue (``%s``: the queue, how many)."""
        where = f"status = '{READY}' AND queue_name = %s AND limit_key IS NULL "
        where += f"AND run_after <= {self.d.now_sql}"
        return self._select(where, ready_order(), 1)

    def _walk(
        self,
        cursor: Any,
        queue: str,
        limit: int,
        lock: str,
        held: Held,
        seen: Collection[str] = (),
        known: dict[str, tuple[int, int, float | None]] | None = None,
    ) -> list[_Row]:
        """Each key of the queue with READY rows, read for as many as it has free slots
        (and, where the window held every kind, the queue's rows without a limit).

        ``seen``: the keys of the queue's window; the keys a recent walk found
        serve (``WalkedKeys``) when they include these. ``known``: slots' state
        this round read already, used for the keys it covers.
        """
        heads = self.walked.get(queue, seen)
        if heads is None:
            heads = self.keys_with_ready_rows(cursor, queue)
            self.walked.put(queue, heads)
        counts = {key: count for key, (count, _) in heads.items()}
        if known is not None and all(key in known for key in counts):
            state = {key: known[key] for key in counts}
        else:
            state = self.limits.slot_state(cursor, counts) if counts else {}
        self._report(state, counts, {k: p for k, (_, p) in heads.items()}, held)
        for key, (_, free, wait) in state.items():
            if free == 0:
                held.add(key, wait)
        wanted = [
            (key, min(free, limit)) for key, (_, free, _) in sorted(state.items()) if free > 0
        ]
        parts = [(self.key_rows_sql(), [queue, key, n]) for key, n in wanted]
        if not self.split:
            # The window held every kind: the rows without a limit, read with the keys'.
            parts.append((self.unlimited_sql(), [queue, limit]))
        return self._read_parts(cursor, parts, lock)

    def _read_parts(self, cursor: Any, parts: list[tuple[str, list[Any]]], lock: str) -> list[_Row]:
        """Each read of ``parts`` (a statement and its parameters), in as few statements
        as the database allows: a ``UNION ALL`` of up to 100, each part locking
        where ``lock`` is given (as ``first_sql``'s); one by one where a locking
        read cannot be a part of a UNION (PostgreSQL's portable claim)."""
        if lock and not self.d.locks_in_union:
            return [row for sql, params in parts for row in self._run(cursor, sql, params, lock)]
        found: list[_Row] = []
        for start in range(0, len(parts), 100):
            chunk = parts[start : start + 100]
            if lock:
                union = " UNION ALL ".join(f"({sql} {lock})" for sql, _ in chunk)
            else:
                union = " UNION ALL ".join(
                    f"SELECT * FROM ({sql}) AS k{j}" for j, (sql, _) in enumerate(chunk)
                )
            found += self._run(cursor, union, [v for _, params in chunk for v in params], "")
        return found

    def keys_with_ready_rows(self, cursor: Any, queue: str) -> dict[str, tuple[int, float]]:
        """The queue's keys with READY rows, each with its limit's count and period
        (of its first row): one look-up a key."""
        heads: dict[str, tuple[int, float]] = {}
        cursor.execute(self.first_key_sql(), [queue])
        row = cursor.fetchone()
        while row is not None:
            heads[row[0]] = (row[1] or 0, row[2] or 0.0)
            cursor.execute(self.next_key_sql(), [queue, row[0]])
            row = cursor.fetchone()
        return heads
