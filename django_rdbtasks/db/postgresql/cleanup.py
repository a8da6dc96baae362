"""PostgreSQL's statements of ``rdbtasks cleanup`` (``cleanup.py``): what holds back
the cleanup of dead row versions in the app's tables, and how those tables stand.

Each statement opens with a comment naming it, so that it can be told apart
in ``pg_stat_activity`` and the server's logs.
"""

from __future__ import annotations

#: The sessions of this database with a transaction id or a snapshot: each keeps
#: every row version that it could still see. ``backend_xid``: it has written;
#: ``backend_xmin``: the oldest snapshot it holds (a REPEATABLE READ
#: transaction's, pg_dump's, a long query's). Sessions of other databases do
#: not hold this one's tables back; walsenders are the replicas below, and
#: autovacuum's own snapshot does not hold back another vacuum. This
#: session is left out.
PG_SESSIONS = """
    -- rdbtasks_cleanup_sessions
    SELECT pid,
           coalesce(state, ''),
           coalesce(application_name, ''),
           coalesce(host(client_addr), 'local'),
           client_port,
           coalesce(usename::text, ''),
           EXTRACT(EPOCH FROM statement_timestamp() - coalesce(xact_start, query_start)),
           greatest(age(backend_xid), age(backend_xmin)),
           left(coalesce(query, ''), %s)
    FROM pg_stat_activity
    WHERE datname = current_database()
      AND pid <> pg_backend_pid()
      AND backend_type NOT IN ('walsender', 'autovacuum worker')
      AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)
    ORDER BY 8 DESC
"""

#: Transactions prepared for a two-phase commit and never finished: they hold
#: their snapshot like an open one, with no session to end.
PG_PREPARED = """
    -- rdbtasks_cleanup_prepared
    SELECT gid, coalesce(owner::text, ''),
           EXTRACT(EPOCH FROM statement_timestamp() - prepared), age(transaction)
    FROM pg_prepared_xacts
    WHERE database = current_database()
"""

#: Replication slots holding an ``xmin`` (a physical slot of a replica with
#: hot_standby_feedback): the rows stay while the slot does, its consumer
#: connected or not. A logical slot's ``catalog_xmin`` holds back the system
#: catalogs only, not the task tables.
PG_SLOTS = """
    -- rdbtasks_cleanup_slots
    SELECT slot_name, slot_type, active, age(xmin)
    FROM pg_replication_slots
    WHERE xmin IS NOT NULL
"""

#: Replicas whose hot_standby_feedback holds the primary's horizon back to the
#: oldest snapshot of their own queries (without a slot: as long as connected).
PG_REPLICAS = """
    -- rdbtasks_cleanup_replicas
    SELECT pid, coalesce(application_name, ''), coalesce(host(client_addr), 'local'),
           coalesce(state, ''), age(backend_xmin)
    FROM pg_stat_replication
    WHERE backend_xmin IS NOT NULL
"""

#: The app's tables as the statistics collector counts them, by name.
PG_TABLES = """
    -- rdbtasks_cleanup_tables
    SELECT relname, n_live_tup, n_dead_tup,
           last_vacuum, last_autovacuum, last_analyze, last_autoanalyze
    FROM pg_stat_user_tables
    WHERE relid IN (SELECT to_regclass(name) FROM unnest(%s::text[]) AS name)
    ORDER BY n_dead_tup DESC
"""

#: Autovacuum, for the server and for each of the app's tables that turns it off.
PG_AUTOVACUUM = """
    -- rdbtasks_cleanup_autovacuum
    SELECT current_setting('autovacuum') = 'on',
           array(SELECT relname::text FROM pg_class
                 WHERE oid IN (SELECT to_regclass(name) FROM unnest(%s::text[]) AS name)
                   AND reloptions @> ARRAY['autovacuum_enabled=false'])
"""

#: Whether this user sees every session's transaction (a superuser, or a
#: member of pg_read_all_stats); others' rows show NULLs instead.
PG_SEES_ALL = """
    -- rdbtasks_cleanup_privilege
    SELECT rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')
    FROM pg_roles WHERE rolname = current_user
"""
