"""READ_DATABASE: the pages that only read go to the replica alias; changes never do.

The ``replica`` alias of tests/settings.py is a second connection to the test
database (``TEST: {"MIRROR": "default"}``), so every query can be told apart by
the connection that ran it. tests/test_replica.py does the same with a real
streaming standby (``make test-clusters``).
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_rdbtasks import snapshots
from django_rdbtasks.compat import task_backends
from django_rdbtasks.models import Job, JobRecord, Task, TaskStatus, Workflow, WorkflowStep
from django_rdbtasks.reads import read_database
from django_rdbtasks.worker.autoscale import AutoscalePolicy
from django_rdbtasks.worker.supervisor import Supervisor
from tests.browser.support import (
    JOB_VIEW,
    RETRY,
    admin_urls,
    client_for,
    make_task,
    make_worker,
    require_admin,
    text,
    url,
)

# Committed rows: the replica alias is another connection, which does not see
# the uncommitted rows of a test's transaction.
pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "replica"]),
    *admin_urls(),
]
__all__ = ["require_admin"]

PROJECT_TABLES = ("django_rdbtasks_",)


def with_read_database(alias: str | None) -> dict[str, Any]:
    options = dict(settings.TASKS["default"]["OPTIONS"])
    options.pop("READ_DATABASE", None)
    if alias is not None:
        options["READ_DATABASE"] = alias
    return {**settings.TASKS, "default": {**settings.TASKS["default"], "OPTIONS": options}}


@pytest.fixture
def replica() -> Iterator[None]:
    with override_settings(TASKS=with_read_database("replica")):
        yield


class Queries:
    """The statements on the project's tables each alias ran, while open."""

    def __init__(self) -> None:
        self.contexts = {
            alias: CaptureQueriesContext(connections[alias]) for alias in ("default", "replica")
        }

    def __enter__(self) -> Queries:
        for context in self.contexts.values():
            context.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for context in self.contexts.values():
            context.__exit__(*exc)

    def on(self, alias: str) -> list[str]:
        return [
            query["sql"]
            for query in self.contexts[alias].captured_queries
            if any(table in query["sql"] for table in PROJECT_TABLES)
            # What holds back cleanup is read on the primary on purpose: only the
            # statistics views, naming the tables (docs/scaling.md, cleanup.py).
            and "-- rdbtasks_cleanup_" not in query["sql"]
        ]


def reads_only_the_replica(queries: Queries) -> None:
    assert queries.on("replica"), "nothing was read from the replica"
    assert queries.on("default") == [], "the primary was read"


# -- the one answer and its check -------------------------------------------------------------


def test_read_database_is_the_option_or_the_primary_itself(replica: None) -> None:
    assert read_database("default") == "replica"
    assert read_database("replica") == "replica"  # not a backend's DATABASE: itself
    with override_settings(TASKS=with_read_database(None)):
        assert read_database("default") == "default"


def test_a_read_database_not_in_databases_fails_the_checks() -> None:
    with override_settings(TASKS=with_read_database("nowhere")):
        messages = task_backends["default"].check()
    errors = [m for m in messages if m.id == "django_rdbtasks.E050"]
    assert len(errors) == 1
    assert "'nowhere' is not in DATABASES" in errors[0].msg
    assert not [m for m in messages if m.id == "django_rdbtasks.W001"]  # a known option
    with override_settings(TASKS=with_read_database("replica")):
        assert not [m for m in task_backends["default"].check() if m.level >= 40]


# -- what reads off the primary ---------------------------------------------------------------


@pytest.mark.usefixtures("require_admin", "replica")
def test_admin_lists_and_pages_read_the_replica() -> None:
    failed = make_task(TaskStatus.FAILED, job_name="nightly")
    job = Job.objects.create(name="nightly", task_path="tests.testapp.tasks.add", cron="0 3 * * *")
    record = JobRecord.objects.create(job_name="nightly", key="k1", task_id=failed.pk)
    worker = make_worker("host-a:101")
    workflow = Workflow.objects.create(name="order")
    WorkflowStep.objects.create(task=failed, workflow=workflow, name="ship")
    client = client_for(
        *RETRY, *JOB_VIEW, "django_rdbtasks.view_jobrecord", "django_rdbtasks.view_worker"
    )
    pages = [
        url("task_changelist"),
        url("task_changelist") + "?status=FAILED&q=tests",
        url("task_change", failed.pk),
        url("task_dashboard"),
        url("task_retry_failed"),
        url("job_changelist"),
        url("job_change", job.pk),
        url("jobrecord_changelist"),
        url("jobrecord_change", record.pk),
        url("worker_changelist"),
        url("worker_change", worker.pk),
        url("workflow_changelist"),
        url("workflow_change", workflow.pk),
        url("limitslot_changelist"),
    ]
    for page in pages:
        with Queries() as queries:
            response = client.get(page)
        assert response.status_code == 200, (page, response.status_code)
        assert queries.on("default") == [], page
        assert queries.on("replica"), page
    dashboard = text(client.get(url("task_dashboard")))
    # The same server: nothing to replay (PostgreSQL, MySQL), or no replication at all (SQLite).
    lag = "unknown" if connections["default"].vendor == "sqlite" else "0 s"
    assert f"Read from the replica replica, behind the primary by {lag}." in dashboard


@pytest.mark.usefixtures("replica")
def test_rdbtasks_status_and_workers_read_the_replica(capsys: pytest.CaptureFixture) -> None:
    make_task(TaskStatus.READY)
    make_worker("host-a:101")
    with Queries() as queries:
        call_command("rdbtasks", "status")
    reads_only_the_replica(queries)
    assert "Read from replica, a replica; replication lag:" in capsys.readouterr().out
    call_command("rdbtasks", "status", "--json")
    data = json.loads(capsys.readouterr().out)
    assert data["database"] == "default" and data["read_database"] == "replica"
    with Queries() as queries:
        call_command("rdbtasks", "workers")
    reads_only_the_replica(queries)
    # --primary asks the primary itself.
    with Queries() as queries:
        call_command("rdbtasks", "status", "--primary")
    assert queries.on("replica") == [] and queries.on("default")
    assert "a replica" not in capsys.readouterr().out


@pytest.mark.usefixtures("replica")
def test_the_metrics_gauges_read_the_replica() -> None:
    pytest.importorskip("prometheus_client")
    from django_rdbtasks.observability.limit_metrics import LimitCollector
    from django_rdbtasks.observability.metrics import DatabaseCollector

    make_task(TaskStatus.READY)
    with Queries() as queries:
        families = {family.name: family for family in DatabaseCollector().collect()}
        families.update({family.name: family for family in LimitCollector().collect()})
    reads_only_the_replica(queries)
    assert families["rdbtasks_queue_tasks"].samples
    if connections["default"].vendor != "sqlite":  # SQLite: no replica lag to report
        assert families["rdbtasks_replica_lag_seconds"].samples[0].value == 0


@pytest.mark.usefixtures("replica")
def test_the_autoscalers_backlog_sample_reads_the_replica() -> None:
    supervisor = Supervisor(0, {"backend": "default", "queues": ["default"]}, scheduler=False)
    with Queries() as queries:
        supervisor._scale(AutoscalePolicy(minimum=0, maximum=1), 0.0)
    reads_only_the_replica(queries)


def test_without_read_database_nothing_reads_the_replica(capsys: pytest.CaptureFixture) -> None:
    make_task(TaskStatus.READY)
    with Queries() as queries:
        call_command("rdbtasks", "status")
        snapshots.snapshot(replica=True)
    assert queries.on("replica") == [] and queries.on("default")
    assert "a replica" not in capsys.readouterr().out


# -- what never does --------------------------------------------------------------------------


@pytest.mark.usefixtures("require_admin", "replica")
def test_admin_actions_and_buttons_read_and_write_on_the_primary() -> None:
    failed = [make_task(TaskStatus.FAILED) for _ in range(2)]
    client = client_for(*RETRY)
    with Queries() as queries:
        response = client.post(
            url("task_changelist"),
            {"action": "retry_tasks", "_selected_action": [str(failed[0].pk)]},
        )
    assert response.status_code == 302
    assert queries.on("replica") == []
    assert any(sql.lstrip().upper().startswith("UPDATE") for sql in queries.on("default"))
    with Queries() as queries:
        response = client.post(url("task_retry", failed[1].pk))
    assert response.status_code == 302
    assert queries.on("replica") == []
    assert Task.objects.filter(pk__in=[t.pk for t in failed], status=TaskStatus.READY).count() == 2


@pytest.mark.usefixtures("require_admin", "replica")
def test_retry_all_failed_confirms_on_the_primary() -> None:
    make_task(TaskStatus.FAILED)
    client = client_for(*RETRY)
    with Queries() as queries:
        response = client.post(url("task_retry_failed"), {"confirm": "on"})
    assert response.status_code == 302
    assert queries.on("replica") == []
    assert Task.objects.filter(status=TaskStatus.READY).count() == 1


@pytest.mark.usefixtures("require_admin", "replica")
def test_a_job_form_saves_to_the_primary_what_it_read_there() -> None:
    job = Job.objects.create(name="nightly", task_path="tests.testapp.tasks.add", cron="0 3 * * *")
    client = client_for(*JOB_VIEW)
    form = {
        "name": "nightly",
        "task_path": "tests.testapp.tasks.add",
        "kwargs": "{}",
        "queue_name": "default",
        "priority": "0",
        "cron": "0 4 * * *",
        "timezone": "UTC",
        "misfire_policy": job.misfire_policy,
        "enabled": "on",
    }
    with Queries() as queries:
        response = client.post(url("job_change", job.pk), form)
    assert response.status_code == 302, text(response)[:2000]
    assert queries.on("replica") == []
    job.refresh_from_db()
    assert job.cron == "0 4 * * *"


@pytest.mark.usefixtures("replica")
def test_operator_apis_and_commands_that_write_stay_on_the_primary() -> None:
    failed = make_task(TaskStatus.FAILED)
    with Queries() as queries:
        call_command("requeue", "--all", stdout=io.StringIO())
        snapshots.backend_for_database("default").cancel(str(failed.pk))
        task_backends["default"].get_result(str(failed.pk))
    assert queries.on("replica") == []
    assert queries.on("default")
