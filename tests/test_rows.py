"""The plain values of db/rows.py: a bulk enqueue's ids and its rows."""

import datetime as dt
import time
import uuid

from django_rdbtasks.db.rows import (
    CANDIDATE_COLUMNS,
    CLAIM_COLUMNS,
    CLAIMABLE_COLUMNS,
    Claimable,
    NewBatch,
    new_ids,
)
from django_rdbtasks.models import uuid7


def test_new_ids_are_version_7_uuids_of_this_millisecond_spelled_as_str_spells_them():
    before = time.time_ns() // 1_000_000
    ids = new_ids(5000)
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == 5000
    for text in ids:
        value = uuid.UUID(text)
        assert str(value) == text  # lower case, hyphenated: what results and rows hold
        assert value.version == 7 and value.variant == uuid.RFC_4122
        assert before <= value.int >> 80 <= after
    # Every random digit takes all its values: none is stuck, none lost to
    # the variant (the first digit of the fourth group is 8, 9, a or b).
    groups = [text.split("-") for text in ids]
    assert {g[3][0] for g in groups} == set("89ab")
    for position in range(1, 4):
        assert {g[2][position] for g in groups} == set("0123456789abcdef")
        assert {g[3][position] for g in groups} == set("0123456789abcdef")
    for position in range(12):
        assert {g[4][position] for g in groups} == set("0123456789abcdef")


def test_new_ids_sort_after_the_ids_made_before_them():
    earlier = uuid7()
    time.sleep(0.002)
    (later,) = new_ids(1)
    time.sleep(0.002)
    assert str(earlier) < later < str(uuid7())
    assert new_ids(0) == []


def test_a_batch_as_rows_is_one_new_task_per_id_with_what_they_share():
    when = dt.datetime(2031, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    batch = NewBatch(
        task_path="a.b",
        queue_name="q",
        backend_name="default",
        priority=-4,
        max_attempts=7,
        run_after=when,
        ids=new_ids(2),
        args_json=["[1]", "[2]"],
        kwargs_json=["{}", '{"k": 1}'],
        trace_context='{"traceparent": "x"}',
    )
    rows = batch.rows()
    assert len(batch) == 2
    assert [str(row.id) for row in rows] == batch.ids
    assert [(row.args_json, row.kwargs_json) for row in rows] == [
        ("[1]", "{}"),
        ("[2]", '{"k": 1}'),
    ]
    for row in rows:
        assert (row.task_path, row.queue_name, row.backend_name) == ("a.b", "q", "default")
        assert (row.priority, row.max_attempts, row.run_after) == (-4, 7, when)
        assert (row.status, row.job_name, row.dedup_key, row.limit) == ("READY", "", None, None)
        assert row.trace_context == '{"traceparent": "x"}'


def test_a_claimable_row_claimed_is_what_the_claim_writes_over_what_was_read():
    """``Claimable.claimed``: the version and the attempts one up, the attempt's
    time the read's, ``started_at`` kept where an earlier attempt set it; every
    other column as read (MySQL's hand-over builds its claim so: rows.Claimable)."""
    read_at = dt.datetime(2030, 1, 1, 12, 0, 0, 123456)
    earlier = dt.datetime(2029, 12, 31, 23, 0)
    values = {column: f"<{column}>" for column in CLAIM_COLUMNS}
    values.update(version=4, attempts=1, started_at=None, last_attempted_at=earlier)
    first = Claimable("id", 4, "READY", "", None, values=tuple(values.values()), read_at=read_at)
    claimed = dict(zip(CLAIM_COLUMNS, first.claimed(), strict=True))
    assert (claimed["version"], claimed["attempts"]) == (5, 2)
    assert claimed["started_at"] == claimed["last_attempted_at"] == read_at
    unchanged = set(CLAIM_COLUMNS) - {"version", "attempts", "started_at", "last_attempted_at"}
    assert {c: claimed[c] for c in unchanged} == {c: values[c] for c in unchanged}
    values["started_at"] = earlier
    again = Claimable("id", 4, "READY", "", None, values=tuple(values.values()), read_at=read_at)
    assert dict(zip(CLAIM_COLUMNS, again.claimed(), strict=True))["started_at"] == earlier
    # What the read carries beyond the candidate and the order is the rest of the claim's.
    assert set(CLAIMABLE_COLUMNS).isdisjoint(CANDIDATE_COLUMNS)
    assert {*CLAIMABLE_COLUMNS, *CANDIDATE_COLUMNS, "priority", "run_after"} >= set(CLAIM_COLUMNS)
