"""The claim's statements keep a bounded cost whatever the planner's statistics say.

A queue's table changes faster than its statistics: ANALYZE taken while the
drain keeps up says "about one runnable row", and a backlog then builds unseen.
A plan chosen on that belief (a bitmap of every runnable row, joined to the
picked ids by a nested loop) made each round read the whole backlog: 1.7 s a
statement at first, 14 s as the backlog grew (issue 23). Here the statistics
are made to lie both ways, with autovacuum kept out, and each round must read
a number of rows bounded by what it claims, not by the backlog, reaching the
rows it writes by primary key.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from django_rdbtasks.db import dialect_for
from django_rdbtasks.db.postgresql.round import ClaimForm
from django_rdbtasks.db.rows import ClaimRequest, Outcome
from django_rdbtasks.models import LimitSlot, Task
from django_rdbtasks.states import ClaimMode, OutcomeKind, TaskStatus
from tests.server_rows import TABLE, analyze, insert_rows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BACKLOG = 300_000
WANT = 10
#: What one round may read of the task table: its candidates (``candidate_count``),
#: the rows it picks and claims, the outcomes it writes, with room to
#: spare; the backlog is 300,000.
ROWS_READ_BOUND = 1_000
#: What a round's reads of the READY indexes may read, in pages (the scheduled
#: rows' entries alone are 500).
READY_PAGES_BOUND = 100
#: The lease of the claims a test holds across its inserts: an hour, so that a
#: slow machine (300,000 rows inserted on MariaDB under CI's load took over a
#: minute) never sees them expire and a later round claim them again.
HELD_LEASE = 3600.0


@pytest.fixture(autouse=True)
def backlog_truncated() -> Iterator[None]:
    """The task table emptied at once after each test on MySQL/MariaDB.

    Django's flush there DELETEs every row (TRUNCATE is the slower for small
    tables): 7 to 10 seconds a test for a backlog of 300,000.
    """
    yield
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
            cursor.execute(f"TRUNCATE TABLE {TABLE}")
            cursor.execute("SET FOREIGN_KEY_CHECKS = 1")


def modes(vendor: str) -> list[ClaimMode]:
    return [ClaimMode.OPTIMISTIC] + ([ClaimMode.SKIP_LOCKED] if vendor != "sqlite" else [])


def statistics_forgotten() -> None:
    """PostgreSQL: the task and slot tables as if never analyzed (column statistics gone).

    An earlier test's ANALYZE leaves its columns' statistics behind: neither
    TRUNCATE nor an ANALYZE of the emptied table removes them. After
    test_models' 20,000 finished rows without a limit, the planner takes the
    limited READY rows for none and walks the keys through the wrong index
    (docs/sql/postgresql.sql, the walk's ``kk``: every key's step read the
    whole backlog). A test of plans made on an empty table starts from none.
    Needs a superuser, as the tests' PostgreSQL role is.
    """
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM pg_statistic WHERE starelid IN "
            "(SELECT c.oid FROM pg_class c WHERE c.relname = ANY(%s) "
            "OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = %s::regclass))",
            [[TABLE, LimitSlot._meta.db_table], TABLE],
        )


@contextlib.contextmanager
def statistics_frozen() -> Iterator[None]:
    """No automatic ANALYZE while the test runs: the statistics stay the ones it took."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)")
        elif connection.vendor == "mysql":
            cursor.execute(f"ALTER TABLE {TABLE} STATS_AUTO_RECALC = 0")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"ALTER TABLE {TABLE} RESET (autovacuum_enabled)")
            elif connection.vendor == "mysql":
                cursor.execute(f"ALTER TABLE {TABLE} STATS_AUTO_RECALC = DEFAULT")


def claim_some(worker_id: str, mode: ClaimMode, want: int = WANT) -> list[Outcome]:
    """Claim ``want`` rows and say they succeeded: the outcomes of the measured round."""
    dialect = dialect_for(connection)
    with transaction.atomic(), connection.cursor() as cursor:
        request = ClaimRequest(["default"], want, worker_id, HELD_LEASE, mode)
        rows, _ = dialect.claim(cursor, request)
    assert len(rows) == want
    return [
        Outcome(row.id, row.version, OutcomeKind.SUCCESS, entry={"outcome": "ok"}, row=row)
        for row in rows
    ]


# -- what one round reads ----------------------------------------------------------------


class ExplainingCursor:
    """Runs each statement under ``EXPLAIN (ANALYZE, FORMAT JSON)`` and keeps the plans.

    ANALYZE executes the statement, so the round's writes happen as they would.
    """

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor
        self.plans: list[dict] = []
        self.rowcount = 0

    def execute(self, sql: str, params: Any = None) -> None:
        self.cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        document = self.cursor.fetchone()[0]
        if isinstance(document, str):
            document = json.loads(document)
        self.plans.append(document[0]["Plan"])

    def fetchall(self) -> list:
        return []


def plan_nodes(node: dict, under: str = "") -> Iterator[tuple[str, dict]]:
    """Every node of a PostgreSQL JSON plan, with the CTE it belongs to."""
    under = node.get("Subplan Name", under)
    yield under, node
    for child in node.get("Plans", []):
        yield from plan_nodes(child, under)


def rows_examined(node: dict) -> float:
    """Rows a scan node looked at: those it returned and those its filters dropped."""
    per_loop = (
        node["Actual Rows"]
        + node.get("Rows Removed by Filter", 0)
        + node.get("Rows Removed by Index Recheck", 0)
    )
    return per_loop * node["Actual Loops"]


def reads_of_the_table(nodes: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The nodes that read the task table (an UPDATE's own node writes what they read)."""
    return [
        (cte, n)
        for cte, n in nodes
        if n.get("Relation Name") == TABLE and n["Node Type"] != "ModifyTable"
    ]


def postgresql_round(
    outcomes: list[Outcome],
    mode: ClaimMode,
    form: ClaimForm = ClaimForm.LEAN,
    want: int = WANT,
) -> list[tuple[str, dict]]:
    """The nodes of one exchange's plan in the claim's ``form``, executed, then rolled back."""
    dialect = dialect_for(connection)
    dialect.claim_forms[("default",)] = form
    with transaction.atomic(), connection.cursor() as cursor:
        # Asked before: the plans are those of a round that moves finished rows.
        assert dialect.finished.moves(cursor.cursor)
        explaining = ExplainingCursor(cursor.cursor)
        dialect.exchange(
            explaining, outcomes, "w", ClaimRequest(["default"], want, "w", 60.0, mode)
        )
        transaction.set_rollback(True)
    [plan] = explaining.plans
    return list(plan_nodes(plan))


def mysql_rows_read(run: Any) -> int:
    """Rows the server's handlers read while ``run`` ran (MySQL/MariaDB session counters)."""

    def counters() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'")
            return sum(int(value) for _, value in cursor.fetchall())

    before = counters()
    baseline = counters() - before  # what SHOW STATUS itself reads
    start = counters()
    run()
    return counters() - start - baseline


def assert_round_reads_a_bounded_number_of_rows(outcomes: list[Outcome], mode: ClaimMode) -> None:
    vendor = connection.vendor
    if vendor == "postgresql":
        # Each form of the claim a round may take (db/postgresql/round.py).
        for form in ClaimForm:
            assert_statement_reads_a_bounded_number_of_rows(outcomes, mode, form)
        return
    dialect = dialect_for(connection)

    def run() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            result = dialect.exchange(
                cursor, outcomes, "w", ClaimRequest(["default"], WANT, "w", 60.0, mode)
            )
            assert len(result.written) == len(outcomes)
            transaction.set_rollback(True)

    if vendor == "mysql":
        read = mysql_rows_read(run)
        assert read <= ROWS_READ_BOUND, f"{read} rows read by one round"
    else:
        run()


def assert_statement_reads_a_bounded_number_of_rows(
    outcomes: list[Outcome], mode: ClaimMode, form: ClaimForm, want: int = WANT
) -> None:
    """PostgreSQL: the round's statement in ``form``, from its executed plan."""
    nodes = postgresql_round(outcomes, mode, form, want)
    on_table = reads_of_the_table(nodes)
    pkey = f"{TABLE}_pkey"
    # A bitmap of the ids a round names (its outcomes' rows) is bounded by
    # them; one of any other index would be of every READY or RUNNING row.
    bitmaps = [
        n["Index Name"]
        for _, n in nodes
        if n["Node Type"] == "Bitmap Index Scan" and n["Index Name"] != pkey
    ]
    assert not bitmaps, f"{form.name}: a bitmap over runnable rows: {bitmaps}"
    assert not [n for _, n in on_table if n["Node Type"] == "Seq Scan"], (
        form.name,
        [cte for cte, n in on_table if n["Node Type"] == "Seq Scan"],
    )
    read = sum(rows_examined(n) for _, n in on_table)
    bound = ROWS_READ_BOUND * max(1, want // WANT)
    assert read <= bound, f"{form.name}: {read} rows read: {on_table}"
    by_pk = {cte for cte, n in on_table if reached_by(n) == {pkey}}
    by_location = {cte for cte, n in on_table if n["Node Type"] == "Tid Scan"}
    # The outcomes' rows are found by primary key and locked (``mine``), the
    # picked rows where the read found them (optimistic ``go``: by ``ctid``),
    # both then written where they were locked (by ``ctid``:
    # postgresql.round.IN_MINE); the runnable rows are read in the order of
    # their index, with a limit.
    shape = [(cte, n["Node Type"], n.get("Index Name")) for cte, n in on_table]
    assert "CTE mine" in by_pk, (form.name, shape)
    assert {"CTE d0", "CTE claimed"} <= by_location, (form.name, shape)
    if mode == ClaimMode.OPTIMISTIC:
        assert "CTE go" in by_location, (form.name, shape)
    ready = [n for _, n in on_table if n.get("Index Name", "").startswith("rdbtasks_task_ready")]
    scans = {"Index Scan", "Index Only Scan"}
    assert ready and all(n["Node Type"] in scans for n in ready), (form.name, shape)


def reached_by(node: dict) -> set[str]:
    """The indexes a read of the table goes through: its own, or its bitmap's."""
    if node["Node Type"] != "Bitmap Heap Scan":
        return {node["Index Name"]} if "Index Name" in node else set()
    found: set[str] = set()
    stack = list(node.get("Plans", []))
    while stack:
        child = stack.pop()
        if child["Node Type"] == "Bitmap Index Scan":
            found.add(child["Index Name"])
        stack.extend(child.get("Plans", []))
    return found


def assert_renewal_reads_a_bounded_number_of_rows(outcomes: list[Outcome]) -> None:
    dialect = dialect_for(connection)
    held = [(o.id, o.version) for o in outcomes]
    if connection.vendor == "postgresql":
        with transaction.atomic(), connection.cursor() as cursor:
            explaining = ExplainingCursor(cursor.cursor)
            dialect.renew(explaining, held, "w", 60.0)
            transaction.set_rollback(True)
        nodes = list(plan_nodes(explaining.plans[0]))
        on_table = [n["Node Type"] for _, n in reads_of_the_table(nodes)]
        indexes = {n["Index Name"] for _, n in nodes if "Index Name" in n}
        # The task rows by primary key; their limit slots (if any) by holder.
        assert indexes == {f"{TABLE}_pkey", "rdbtasks_limit_holder"}, indexes
        assert "Seq Scan" not in on_table, on_table
    elif connection.vendor == "mysql":

        def run() -> None:
            with connection.cursor() as cursor:
                assert len(dialect.renew(cursor, held, "w", 60.0)[0]) == len(held)

        assert mysql_rows_read(run) <= ROWS_READ_BOUND


def test_a_backlog_the_statistics_never_saw_does_not_slow_a_round(vendor):
    # What ANALYZE sees while a drain keeps up: finished rows, the few the
    # workers hold, nothing waiting.
    insert_rows(20_000, TaskStatus.SUCCESSFUL)
    insert_rows(len(modes(vendor)) * WANT, TaskStatus.READY)
    held = {mode: claim_some("w", mode) for mode in modes(vendor)}
    analyze()
    with statistics_frozen():
        insert_rows(BACKLOG, TaskStatus.READY)
        for mode in modes(vendor):
            assert_round_reads_a_bounded_number_of_rows(held[mode], mode)
        assert_renewal_reads_a_bounded_number_of_rows(held[modes(vendor)[0]])
        assert_rows_by_id_are_reached_by_primary_key()


@pytest.mark.parametrize("want", [100, 200, 400])
def test_a_full_batch_from_a_table_the_statistics_know_is_looked_up_by_primary_key(vendor, want):
    """A drain's usual round: hundreds wanted (no-op tasks claim up to 400 a
    round) from a table ANALYZE saw full of READY rows. The optimistic claim's
    candidates were joined back to the table by a hash join over a scan of all
    of it (20,000 rows for 100 claimed, 17 ms a round); each is now looked up
    by primary key, in claim order, until the batch is full."""
    if vendor != "postgresql":
        pytest.skip("the PostgreSQL round's plan")
    insert_rows(20_000, TaskStatus.READY)
    analyze()
    with statistics_frozen():
        held = claim_some("w", ClaimMode.OPTIMISTIC, want=want)
        for form in ClaimForm:
            assert_statement_reads_a_bounded_number_of_rows(
                held, ClaimMode.OPTIMISTIC, form, want=want
            )


def assert_rows_by_id_are_reached_by_primary_key() -> None:
    """``among``, as the hand-back and the release of dependants use it."""
    ids = list(Task.objects.filter(status=TaskStatus.READY).values_list("pk", flat=True)[:20])
    found = Task.objects.among(ids, TaskStatus.READY)
    if connection.vendor == "postgresql":
        plan = found.explain()
        assert f"{TABLE}_pkey" in plan and "rdbtasks_task_ready" not in plan, plan
    elif connection.vendor == "mysql":
        assert mysql_rows_read(lambda: len(found)) <= 100
    assert found.count() == 20


def test_statistics_of_a_backlog_since_drained_do_not_slow_a_round(vendor):
    insert_rows(BACKLOG, TaskStatus.READY)
    analyze()
    with statistics_frozen():
        held = {mode: claim_some("w", mode) for mode in modes(vendor)}
        # Drained as workers drain: every row finished by an UPDATE, its
        # index entries left behind for VACUUM.
        Task.objects.filter(status=TaskStatus.READY).update(status=TaskStatus.SUCCESSFUL)
        insert_rows(4 * WANT, TaskStatus.READY)
        for mode in modes(vendor):
            assert_round_reads_a_bounded_number_of_rows(held[mode], mode)
        assert_renewal_reads_a_bounded_number_of_rows(held[modes(vendor)[0]])


def test_another_queues_expired_leases_do_not_slow_a_round(vendor):
    """A dead fleet's claims in a queue nobody serves are never walked through."""
    insert_rows(20_000, TaskStatus.SUCCESSFUL)
    insert_rows(len(modes(vendor)) * WANT + 4 * WANT, TaskStatus.READY)
    held = {mode: claim_some("w", mode) for mode in modes(vendor)}
    analyze()
    with statistics_frozen():
        insert_rows(BACKLOG, TaskStatus.RUNNING, queue="abandoned")
        for mode in modes(vendor):
            assert_round_reads_a_bounded_number_of_rows(held[mode], mode)


def take_every_slot(key: str, count: int) -> None:
    """``key``'s ``count`` slots, all held by claims whose leases run for an hour."""
    with connection.cursor() as cursor:
        free_at = dialect_for(connection).now_plus_sql("%s")
        for slot in range(count):
            cursor.execute(
                f"INSERT INTO {LimitSlot._meta.db_table} ({connection.ops.quote_name('key')}, "
                f"slot_no, period, free_at) VALUES (%s, %s, 0, {free_at})",
                [key, slot, dialect_for(connection).seconds_param(3600)],
            )


def test_a_full_keys_backlog_does_not_slow_a_round(vendor):
    """A key whose slots are all taken, 300,000 READY rows of it ahead of the rest.

    Each round used to walk them all, a slot probe per row (135 ms a round
    with 50,000 of them); it now reads a window of them and then the queue's
    keys, one look-up a key, and still claims what is behind: the other
    key's rows and the unlimited ones, in order.
    """
    insert_rows(20_000, TaskStatus.SUCCESSFUL)
    insert_rows(len(modes(vendor)) * WANT, TaskStatus.READY)
    held = {mode: claim_some("w", mode) for mode in modes(vendor)}
    take_every_slot("concurrency:full", 3)
    analyze()
    with statistics_frozen():
        insert_rows(BACKLOG, TaskStatus.READY, limit_key="concurrency:full")
        insert_rows(2, TaskStatus.READY, limit_key="concurrency:other")
        insert_rows(2 * WANT, TaskStatus.READY)
        for mode in modes(vendor):
            assert_round_reads_a_bounded_number_of_rows(held[mode], mode)
        # A real round claims what is behind the backlog, none of the full key.
        with transaction.atomic(), connection.cursor() as cursor:
            request = ClaimRequest(["default"], 100, "w2", 60.0)
            first = dialect_for(connection).exchange(cursor, [], "w2", request)
        assert first.missing == [("concurrency:other", 3, 0.0)]
        with transaction.atomic(), connection.cursor() as cursor:
            dialect_for(connection).limits.make_slots(cursor, first.missing)
        with transaction.atomic(), connection.cursor() as cursor:
            second = dialect_for(connection).exchange(cursor, [], "w2", request)
        claimed = Counter(r.limit_key for r in first.claimed + second.claimed)
        assert claimed == {"concurrency:other": 2, None: 2 * WANT}


def test_a_hand_over_reads_one_row_of_its_keys_backlog(vendor):
    """The hand-over alone (``ClaimRequest.hand_over``): a limited task's outcome
    gives its slot to its key's next READY row, 300,000 of them behind it, and
    reads the key's index for that row only, on statistics that never saw them;
    and the slot by its holder's index, among the slots of 1,000 other keys
    (MySQL's hand-over writes the slot and the claim in one UPDATE of both
    tables, which would lock every slot it scanned)."""
    key = "concurrency:full"
    insert_rows(3, TaskStatus.READY, limit_key=key)
    dialect = dialect_for(connection)
    others = [(f"concurrency:other:{i}", 3, 0.0) for i in range(1000)]
    with transaction.atomic(), connection.cursor() as cursor:
        dialect.limits.make_slots(cursor, [(key, 3, 0.0), *others])
    held = claim_some("w", ClaimMode.OPTIMISTIC, want=3)
    analyze()
    with statistics_frozen():
        insert_rows(BACKLOG, TaskStatus.READY, limit_key=key)
        insert_rows(2 * WANT, TaskStatus.READY)
        request = ClaimRequest(["default"], 1, "w", HELD_LEASE, hand_over=True)

        def run() -> None:
            with transaction.atomic(), connection.cursor() as cursor:
                result = dialect.exchange(cursor, held[:1], "w", request)
                assert result.handed_over and [r.limit_key for r in result.claimed] == [key]
                if vendor == "postgresql":
                    cursor.execute(
                        "SELECT seq_tup_read, idx_tup_fetch FROM pg_stat_xact_user_tables "
                        "WHERE relname = %s",
                        [TABLE],
                    )
                    scanned, fetched = cursor.fetchone()
                    assert scanned == 0 and fetched <= ROWS_READ_BOUND, (scanned, fetched)
                transaction.set_rollback(True)

        if vendor == "mysql":
            read = mysql_rows_read(run)
            assert read <= ROWS_READ_BOUND, f"{read} rows read by one hand-over"
        else:
            run()


@pytest.mark.parametrize("retried", [False, True], ids=["scheduled", "backing-off"])
def test_tasks_due_later_do_not_slow_a_round(vendor, retried):
    """100,000 READY rows due in an hour, at the highest priority, ahead of the few
    due now: a round reads the due ones, not every row due later (500 pages a round,
    14 ms, when the read walked the index in its order past them). Scheduled by
    their producer, or waiting out a retry's backoff: the two kinds of deferred row."""
    if vendor != "postgresql":
        pytest.skip("the PostgreSQL round's plan")
    insert_rows(BACKLOG // 3, TaskStatus.READY, scheduled=True, retried=retried)
    insert_rows(4 * WANT, TaskStatus.READY)
    analyze()
    with statistics_frozen():
        held = claim_some("w", ClaimMode.OPTIMISTIC)
        for mode in modes(vendor):
            for form in ClaimForm:
                assert_statement_reads_a_bounded_number_of_rows(held, mode, form)
                # Entries an index scan passes over are in no row count: its pages are.
                reads = [
                    n
                    for _, n in postgresql_round(held, mode, form)
                    if n.get("Index Name", "").startswith("rdbtasks_task_ready")
                ]
                pages = sum(n["Shared Hit Blocks"] + n["Shared Read Blocks"] for n in reads)
                assert pages <= READY_PAGES_BOUND, f"{mode} {form.name}: {pages} pages read"


# -- what the load sample and the snapshot read ------------------------------------------


def test_reads_of_ready_rows_count_them_without_reading_finished_ones(vendor):
    """The autoscaler's sample, ``snapshots.snapshot`` (dashboard, ``rdbtasks status``,
    metrics) and ``Task.objects.ready()`` (the admin's filters) count the READY
    rows of every kind, and, on PostgreSQL, read them off their partial
    indexes: a read of ``status = 'READY'`` alone matches none of them and read
    the whole table, finished rows and all (71 ms of a sample on 440,000 rows,
    every few seconds)."""
    import datetime as dt

    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from django_rdbtasks import snapshots
    from django_rdbtasks.worker.autoscale import sample_load

    insert_rows(BACKLOG // 3, TaskStatus.SUCCESSFUL)
    insert_rows(5, TaskStatus.READY)  # fresh
    insert_rows(3, TaskStatus.READY, retried=True)  # due again after a retry's backoff
    insert_rows(2, TaskStatus.READY, limit_key="concurrency:k")
    insert_rows(4, TaskStatus.READY, scheduled=True)
    later = timezone.now() + dt.timedelta(hours=1)  # the producer asked for an hour ahead
    Task.objects.filter(requested_run_after__isnull=False).update(run_after=later)
    insert_rows(1, TaskStatus.RUNNING)
    analyze()
    with statistics_frozen(), CaptureQueriesContext(connection) as captured:
        load = sample_load("default", ["default"])
        (stats,) = snapshots.snapshot("default", queues=["default"]).queues.values()
        # The admin's READY and Scheduled filters, and their counts.
        every, due = Task.objects.ready().count(), Task.objects.runnable().count()
    assert (every, due) == (14, 10)
    assert (load.ready, load.running) == (10, 1)
    assert (stats.ready, stats.scheduled) == (10, 4)
    assert load.lag is not None and stats.oldest_runnable is not None
    if vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for query in captured.captured_queries:
            if "'READY'" not in query["sql"]:
                continue  # the others: RUNNING's lease index, finished rows of the last hour
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query["sql"])
            document = cursor.fetchone()[0]
            plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
            for _, node in reads_of_the_table(list(plan_nodes(plan))):
                assert node["Node Type"] != "Seq Scan", query["sql"]
                assert rows_examined(node) <= ROWS_READ_BOUND, (query["sql"], node)
