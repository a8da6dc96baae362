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
"""

from __future__ import annotations

FRESH = "limit_key IS NULL AND requested_run_after IS NULL AND started_at IS NULL"
DEFERRED = "limit_key IS NULL AND (requested_run_after IS NOT NULL OR started_at IS NOT NULL)"
LIMITED = "limit_key IS NOT NULL"
