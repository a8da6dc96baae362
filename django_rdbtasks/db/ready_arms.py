"""The READY rows as the claim's partial indexes split them, as SQL conditions.

Each arm is the condition of one index (``models.tasks``, migrations 0010
and 0014), written here as the claim's reads must spell it: PostgreSQL and
SQLite use a partial index only for a query whose WHERE states the index's
condition.

- ``FRESH``: enqueued to run at once, never started: nearly every row a
  busy queue holds. Their ``run_after`` is the clock of the write that made
  them READY (the enqueue, or a parent's end that released them), so each
  new one sorts after the others and its index entry is added at the
  index's right edge; and every one is due, so the claim reads them in the
  index's order without walking past any (``RoundSQL.fresh_rows``). Every
  write that sets a later ``run_after`` sets ``requested_run_after`` (the
  producer asked) or follows a claim, which set ``started_at``.
- ``DEFERRED``: the rest of the rows without a limit: due at a time their
  producer asked for (``requested_run_after``), or between attempts (a
  retry's backoff, a postpone, a handover, a requeue: ``started_at`` is
  set). Kept out of ``FRESH``'s index because many of them are due later:
  in one index with the fresh rows, each fresh row would sort before them
  and be inserted in the index's middle, where a full page is split in two
  and its half logged (measured: 8 to 10 % more WAL a task with 100,000
  tasks scheduled for later, docs/benchmarks.md).
- ``LIMITED``: rows under a concurrency or rate limit (docs/limits.md).

MySQL and MariaDB have no partial indexes: there one index holds every
READY row, and the reads do not split them (``ReadyReads.split``).

The arms are written once, here, as which columns are NULL: ``sql`` spells
an arm for the claim's reads, and ``models.ready`` makes the ORM's conditions
(the indexes' own, and the reads of the admin and the operators) from the same
``ReadyArm``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReadyArm:
    """A READY row's arm, as which of its columns are NULL."""

    #: Columns that are NULL.
    null: tuple[str, ...] = ()
    #: Columns that are not NULL.
    not_null: tuple[str, ...] = ()
    #: Columns at least one of which is not NULL (none: no such condition).
    any_not_null: tuple[str, ...] = ()

    @property
    def sql(self) -> str:
        """The arm as a SQL condition on the task table's columns (unqualified)."""
        terms = [f"{column} IS NULL" for column in self.null]
        terms += [f"{column} IS NOT NULL" for column in self.not_null]
        if self.any_not_null:
            terms.append(
                "(" + " OR ".join(f"{column} IS NOT NULL" for column in self.any_not_null) + ")"
            )
        return " AND ".join(terms)


FRESH_ARM = ReadyArm(null=("limit_key", "requested_run_after", "started_at"))
DEFERRED_ARM = ReadyArm(null=("limit_key",), any_not_null=("requested_run_after", "started_at"))
LIMITED_ARM = ReadyArm(not_null=("limit_key",))
#: The arms as the claim's reads spell them.
FRESH, DEFERRED, LIMITED = FRESH_ARM.sql, DEFERRED_ARM.sql, LIMITED_ARM.sql
