"""The claim order, defined once (``db/claim_order.py``): the indexes the claim reads end
in it, and the portable claim's Python sort orders rows as the SQL does."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone

from django_rdbtasks.db.claim_order import (
    CLAIM_ORDER,
    claim_order,
    index_fields,
    ready_order,
    sort_key,
)
from django_rdbtasks.models import Task

#: The claim's indexes of READY rows, and the columns before the claim order in each.
READY_INDEXES = {
    "rdbtasks_task_ready": ["queue_name"],
    "rdbtasks_task_ready_fresh": ["queue_name"],
    "rdbtasks_task_ready_deferred": ["queue_name"],
    "rdbtasks_task_ready_limited": ["queue_name"],
    "rdbtasks_task_ready_key": ["queue_name", "limit_key"],
}


def test_the_sql_spellings():
    assert CLAIM_ORDER == "reclaim, priority DESC, run_after"
    assert ready_order("la") == "la.priority DESC, la.run_after"
    assert ready_order(after=["limit_key"]) == "limit_key, priority DESC, run_after"
    assert claim_order("x") == "x, priority DESC, run_after"


def test_the_indexes_the_claim_reads_end_in_its_order():
    """In the model, and in the state the migrations leave (the tables as made)."""
    migrated = MigrationLoader(None, ignore_no_migrations=True).project_state()
    models = (Task, migrated.apps.get_model("django_rdbtasks", "Task"))
    for model in models:
        indexes = {index.name: index.fields for index in model._meta.indexes}
        for name, leading in READY_INDEXES.items():
            assert list(indexes[name]) == index_fields(*leading), (model, name)


@pytest.mark.django_db(transaction=True)
def test_the_python_sort_is_the_sql_order():
    """Rows of every priority and due time, expired leases among them, sorted by
    ``sort_key`` as the database sorts them by ``claim_order``."""
    now = timezone.now().replace(microsecond=0)
    for i, (priority, minutes, status) in enumerate(
        [
            (0, 5, "READY"),
            (10, 1, "READY"),
            (-5, 9, "READY"),
            (10, 3, "READY"),
            (0, 2, "RUNNING"),
            (-100, 7, "RUNNING"),
            (0, 4, "READY"),
            (100, 8, "READY"),
        ]
    ):
        Task.objects.create(
            task_path=f"a.b{i}",
            priority=priority,
            status=status,
            run_after=now - dt.timedelta(minutes=minutes),
        )
    reclaim = "CASE WHEN status = 'RUNNING' THEN 0 ELSE 1 END"
    with connection.cursor() as cursor:
        order = claim_order(reclaim)
        cursor.execute(f"SELECT task_path FROM django_rdbtasks_task ORDER BY {order}")
        in_sql = [row[0] for row in cursor.fetchall()]
    rows = Task.objects.values_list("task_path", "status", "priority", "run_after")
    in_python = [
        path
        for path, status, priority, run_after in sorted(
            rows, key=lambda r: sort_key(0 if r[1] == "RUNNING" else 1, r[2], r[3])
        )
    ]
    assert in_python == in_sql
    # The expired leases first, whatever their priority; then priority 100
    # before 10, and of two of 10 the one due earlier.
    assert in_sql[:5] == ["a.b4", "a.b5", "a.b7", "a.b3", "a.b1"]
