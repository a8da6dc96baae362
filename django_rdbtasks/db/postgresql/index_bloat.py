"""PostgreSQL's statements of ``index_rebuild.py``: the task table's indexes that a
held-back cleanup left grown, and their rebuild.

Each statement opens with a comment naming it, so that it can be told apart
in ``pg_stat_activity`` and the server's logs.
"""

from __future__ import annotations

#: Bytes an entry of the task table's btree indexes takes at most, with its
#: page's share of overhead: a generous bound (their widest key, queue, key,
#: priority and time, is under 100 bytes for the usual names), so that an
#: index is called grown only when it is many times what its rows need.
ENTRY_BYTES = 128

#: The task table's valid btree indexes larger than ``factor`` times what its
#: live rows need (``ENTRY_BYTES`` each, by the statistics' live row count)
#: plus ``slack`` bytes, largest first. The table's own rows only
#: (``pg_stat_user_tables`` counts the finished rows' child table apart).
#: After a pinned snapshot, vacuum removes the dead entries, but the pages
#: they filled stay in the file, empty, for new entries: the index keeps the
#: size the pin grew it to until it is rebuilt.
PG_GROWN_INDEXES = """
    -- rdbtasks_grown_indexes
    SELECT c.relname, pg_relation_size(c.oid)
    FROM pg_index AS i
    JOIN pg_class AS c ON c.oid = i.indexrelid
    JOIN pg_am AS am ON am.oid = c.relam
    WHERE i.indrelid = %(table)s::regclass
      AND am.amname = 'btree'
      AND i.indisvalid
      AND pg_relation_size(c.oid) > %(slack)s + %(factor)s * %(entry)s * coalesce(
            (SELECT greatest(n_live_tup, 0) FROM pg_stat_user_tables
             WHERE relid = %(table)s::regclass), 0)
    ORDER BY 2 DESC
"""

#: Seconds the oldest snapshot or transaction id of another session of this
#: database has been held (0 if none). A rebuild waits for every transaction
#: older than it; while one is held, the rebuilt index would grow again with
#: the dead entries it must keep, and the rebuild would hold its lock (which
#: keeps autovacuum off the table) for as long.
PG_OLDEST_SNAPSHOT = """
    -- rdbtasks_oldest_snapshot
    SELECT coalesce(max(EXTRACT(EPOCH FROM statement_timestamp()
                                - coalesce(xact_start, query_start))), 0)
    FROM pg_stat_activity
    WHERE datname = current_database()
      AND pid <> pg_backend_pid()
      AND backend_type NOT IN ('walsender', 'autovacuum worker')
      AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)
"""

#: What a rebuild that failed part way left behind: the new index it was
#: building (``<name>_ccnew``, ``_ccnew1``...), invalid, which every write of
#: the table still maintains until it is dropped.
PG_REBUILD_LEFTOVERS = """
    -- rdbtasks_rebuild_leftovers
    SELECT c.relname
    FROM pg_index AS i
    JOIN pg_class AS c ON c.oid = i.indexrelid
    WHERE i.indrelid = %(table)s::regclass
      AND NOT i.indisvalid
      AND c.relname ~ '_ccnew[0-9]*$'
"""


def rebuild_sql(quoted_index: str) -> str:
    """Rebuild one index without blocking the table's writes (PostgreSQL 12+)."""
    return f"-- rdbtasks_rebuild_index\nREINDEX INDEX CONCURRENTLY {quoted_index}"


def drop_leftover_sql(quoted_index: str) -> str:
    """Drop an invalid index a failed rebuild left, without blocking the table's writes."""
    return f"-- rdbtasks_drop_rebuild_leftover\nDROP INDEX CONCURRENTLY IF EXISTS {quoted_index}"
