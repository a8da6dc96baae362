"""``manage.py rdbtasks status|workers``, ``prunetasks`` and ``requeue``."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError

from django_rdbtasks.models import Task, TaskStatus
from tests.browser.support import make_task, make_worker, now
from tests.conftest import ROOT, held_snapshot

pytestmark = pytest.mark.django_db


def run(*args: str) -> tuple[int, str]:
    """The command's exit code and output."""
    out = StringIO()
    try:
        call_command(*args, stdout=out, stderr=StringIO())
    except SystemExit as exit:
        return int(exit.code or 0), out.getvalue()
    return 0, out.getvalue()


# -- rdbtasks status ---------------------------------------------------------------------------


def test_status_table() -> None:
    make_task(run_after=now() - dt.timedelta(seconds=30))
    make_task(queue_name="emails")
    make_task(TaskStatus.RUNNING)
    make_task(TaskStatus.FAILED)
    make_worker("host-a:101", running=1)
    code, out = run("rdbtasks", "status")
    assert code == 0
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("QUEUE"))
    assert header.split()[:7] == [
        "QUEUE",
        "READY",
        "SCHEDULED",
        "WAITING",
        "RUNNING",
        "STALLED",
        "LAG",
    ]
    default = next(line for line in lines if line.startswith("default")).split()
    assert default[1:6] == ["1", "0", "0", "1", "0"]
    assert default[6].endswith("s")  # the lag, about 30 s
    assert next(line for line in lines if line.startswith("TOTAL")).split()[1] == "2"
    assert "Workers: 1 alive, running 1 task." in out
    assert "Health" not in out  # no limit configured


def test_status_json() -> None:
    make_task(queue_name="emails")
    code, out = run("rdbtasks", "status", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["queues"]["emails"]["ready"] == 1
    assert data["health"] == {"ok": True, "checks": []}
    assert set(data["total"]) >= {"ready", "running", "failed", "lag_seconds"}


def test_status_exit_code_follows_the_health_limits(settings) -> None:
    make_task(run_after=now() - dt.timedelta(minutes=10))
    code, out = run("rdbtasks", "status", "--max-lag", "60")
    assert code == 1
    assert "Health: UNHEALTHY" in out and "max_lag" in out and "FAILED" in out
    assert run("rdbtasks", "status", "--max-lag", "3600")[0] == 0
    # No live worker: a probe with --min-workers fails; the JSON says why.
    code, out = run("rdbtasks", "status", "--json", "--min-workers", "1")
    assert code == 1
    assert json.loads(out)["health"]["checks"][0] == {
        "name": "MIN_WORKERS",
        "value": 0,
        "limit": 1.0,
        "ok": False,
    }
    make_worker()
    assert run("rdbtasks", "status", "--quiet", "--min-workers", "1")[0] == 0
    # From the setting, and --quiet prints nothing.
    settings.RDBTASKS_HEALTH = {"MAX_READY": 0}
    code, out = run("rdbtasks", "status", "--quiet")
    assert (code, out) == (1, "")


def test_status_of_some_queues_and_another_window() -> None:
    make_task(queue_name="emails")
    make_task(TaskStatus.SUCCESSFUL, at=now() - dt.timedelta(minutes=30))
    _, out = run("rdbtasks", "status", "--queue", "emails", "--window", "15min")
    assert "OK/15.0min" in out
    table = out.split("\n\n")[1]  # the queues, between blank lines
    rows = [line.split()[0] for line in table.splitlines()[1:]]
    assert rows == ["emails", "TOTAL"]
    data = json.loads(run("rdbtasks", "status", "--json", "--window", "1h")[1])
    assert data["total"]["succeeded"] == 1


@pytest.mark.parametrize(
    ("window", "message"), [("15", "has no unit"), ("1m", "ambiguous"), ("soon", "not an age")]
)
def test_status_window_needs_a_unit(window, message) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("rdbtasks", "status", "--window", window, stdout=StringIO())


def test_status_refuses_an_unknown_queue_as_requeue_does() -> None:
    """Issue 39: ``--queue defualt --max-ready 0`` printed zeros, ``Health: OK``, exit 0."""
    make_task(queue_name="default")
    with pytest.raises(CommandError) as refused:
        call_command(
            "rdbtasks", "status", "--queue", "defualt", "--max-ready", "0", stdout=StringIO()
        )
    assert str(refused.value) == (
        "No queue 'defualt': no task is in it, and QUEUES has default, emails, other. "
        "Did you mean 'default'?"
    )
    assert refused.value.returncode == 1
    # The queue that is there fails the same limit, and says so.
    assert run("rdbtasks", "status", "--queue", "default", "--max-ready", "0")[0] == 1
    # A queue since removed from QUEUES is known while it holds tasks.
    make_task(queue_name="retired-queue")
    assert run("rdbtasks", "status", "--queue", "retired-queue")[0] == 0


def test_status_names_every_bad_argument_at_once() -> None:
    with pytest.raises(CommandError) as refused:
        call_command(
            "rdbtasks",
            "status",
            "--window",
            "99999999d",
            "--max-lag",
            "-1",
            "--min-workers",
            "-2",
            stdout=StringIO(),
        )
    message = str(refused.value)
    assert message.startswith("Refused, nothing was done:")
    assert "--window: '99999999d' is too long an age: at most 36500d" in message
    assert "--max-lag (or RDBTASKS_HEALTH['MAX_LAG']) must be 0 or more." in message
    assert "--min-workers (or RDBTASKS_HEALTH['MIN_WORKERS']) must be 0 or more." in message


def test_status_names_a_misspelt_health_setting(settings) -> None:
    settings.RDBTASKS_HEALTH = {"MAX_LAGG": 60, "MIN_WORKERS": "many"}
    with pytest.raises(CommandError) as refused:
        call_command("rdbtasks", "status", stdout=StringIO())
    assert "RDBTASKS_HEALTH: unknown key 'MAX_LAGG'. Did you mean 'MAX_LAG' or" in str(
        refused.value
    )
    assert "RDBTASKS_HEALTH['MIN_WORKERS'] must be a number, not 'many'." in str(refused.value)


def test_workers_listing_says_adaptive_where_no_batch_was_given() -> None:
    make_worker("host-a:101", batch=0)
    make_worker("host-a:102", batch=25)
    _, out = run("rdbtasks", "workers")
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert " adaptive " in lines["host-a:101"] and " 0 " not in lines["host-a:101"]
    assert " 25 " in lines["host-a:102"]
    data = {w["name"]: w for w in json.loads(run("rdbtasks", "workers", "--json")[1])}
    assert data["host-a:101"]["batch"] is None and data["host-a:102"]["batch"] == 25


def test_status_exits_2_when_the_database_cannot_be_read(monkeypatch) -> None:
    from django_rdbtasks import snapshots

    def unreachable(*args, **kwargs):
        raise OperationalError("could not connect to server")

    monkeypatch.setattr(snapshots, "snapshot", unreachable)
    with pytest.raises(CommandError, match="could not connect") as raised:
        call_command("rdbtasks", "status")
    assert raised.value.returncode == 2


def test_workers_listing() -> None:
    make_worker("host-a:101")
    make_worker("host-b:202", age=600)
    _, out = run("rdbtasks", "workers")
    assert "host-a:101" in out and "host-b:202" not in out
    _, out = run("rdbtasks", "workers", "--all")
    assert "host-b:202" in out and "gone" in out
    data = json.loads(run("rdbtasks", "workers", "--all", "--json")[1])
    assert {w["name"]: w["state"] for w in data} == {"host-a:101": "alive", "host-b:202": "gone"}


# -- prunetasks --------------------------------------------------------------------------------


def _finished(status: str, days: float, **fields) -> Task:
    return make_task(status, at=now() - dt.timedelta(days=days), **fields)


@pytest.fixture
def no_terminal(monkeypatch):
    """stdin as cron or a CI job has it: nobody to answer a question."""
    monkeypatch.setattr(sys, "stdin", StringIO(""))


def test_prunetasks_dry_run_then_for_real() -> None:
    for _ in range(3):
        _finished("SUCCESSFUL", 10)
    _finished("FAILED", 10, queue_name="emails")
    _finished("SUCCESSFUL", 1)
    make_task()
    _, out = run("prunetasks", "--older-than", "7d", "--dry-run")
    assert out.splitlines() == [
        "Would delete 4 tasks finished more than 7d ago: FAILED 1, SUCCESSFUL 3.",
        "  FAILED in queue emails: 1",
        "  SUCCESSFUL in queue default: 3",
    ]
    assert Task.objects.count() == 6
    _, out = run("prunetasks", "--older-than", "7d", "--batch-size", "2")
    assert "Deleted 4 tasks in 2 batches" in out
    assert Task.objects.count() == 2


def test_prunetasks_by_status() -> None:
    _finished("SUCCESSFUL", 10)
    failed = _finished("FAILED", 10)
    run("prunetasks", "--older-than", "1d", "--status", "successful")
    assert list(Task.objects.values_list("pk", flat=True)) == [failed.pk]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "Say how old"),
        (("--older-than", "soon"), "is not an age"),
        # A bare number once meant seconds and deleted every finished task.
        (("--older-than", "7"), "has no unit: write an age like 7d, 12h, 30min, 45s"),
        (("--older-than", "7.5"), "has no unit"),
        (("--older-than", "0"), "has no unit"),
        (("--older-than", "1m"), "ambiguous.*1min for minutes.*30d"),
        (("--older-than=-1d",), "is not an age"),
        (("--older-than", "7d", "--batch-size", "0"), "at least 1"),
        (("--older-than", "7d", "--confirm-above", "-1"), "0 or more"),
        (("--by-setting", "--older-than", "7d"), "takes its ages"),
    ],
)
def test_prunetasks_refuses_unclear_orders(args, message) -> None:
    old = _finished("SUCCESSFUL", 30)
    with pytest.raises(CommandError, match=message):
        call_command("prunetasks", *args, stdout=StringIO())
    assert Task.objects.filter(pk=old.pk).exists()


@pytest.mark.parametrize("age", ["99999999d", "100000d"])
def test_prunetasks_refuses_an_age_reaching_before_year_one(age) -> None:
    """Issue 39: an OverflowError traceback (``now - age``), now a clear refusal."""
    old = _finished("SUCCESSFUL", 30)
    with pytest.raises(CommandError, match="too long an age: at most 36500d"):
        call_command("prunetasks", "--older-than", age, "--yes", stdout=StringIO())
    assert Task.objects.filter(pk=old.pk).exists()
    # The longest age accepted still reads, and deletes nothing younger.
    _, out = run("prunetasks", "--older-than", "36500d", "--yes")
    assert out.startswith("Deleted 0 tasks in 0 batches")


def test_prunetasks_refuses_a_negative_pause_before_deleting_anything() -> None:
    """Issue 39: ``--pause -1`` deleted a first batch, then ended in a traceback."""
    for _ in range(3):
        _finished("SUCCESSFUL", 30)
    with pytest.raises(CommandError, match=r"--pause must be 0 or more seconds, not -1\."):
        call_command(
            "prunetasks",
            "--older-than",
            "7d",
            "--batch-size",
            "1",
            "--pause",
            "-1",
            "--yes",
            stdout=StringIO(),
        )
    assert Task.objects.count() == 3


def test_prunetasks_names_every_bad_argument_at_once() -> None:
    _finished("SUCCESSFUL", 30)
    with pytest.raises(CommandError) as refused:
        call_command(
            "prunetasks",
            "--older-than",
            "7",
            "--batch-size",
            "0",
            "--pause",
            "nan",
            stdout=StringIO(),
        )
    message = str(refused.value)
    for problem in ("--batch-size must be at least 1.", "--pause must be 0 or more", "has no unit"):
        assert problem in message, message
    assert Task.objects.count() == 1


def test_prunetasks_counts_agree_with_their_nouns() -> None:
    _finished("SUCCESSFUL", 30)
    _, out = run("prunetasks", "--older-than", "7d", "--dry-run")
    assert out.startswith("Would delete 1 task finished more than 7d ago: SUCCESSFUL 1.")
    _, out = run("prunetasks", "--older-than", "7d", "--yes")
    assert out == "Deleted 1 task in 1 batch: SUCCESSFUL 1.\n"


def test_prunetasks_refuses_unfinished_statuses() -> None:
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("prunetasks", "--older-than", "1d", "--status", "READY", stdout=StringIO())


def test_prunetasks_asks_before_more_than_a_thousand_and_refuses_without_a_terminal(
    no_terminal,
) -> None:
    template = _finished("SUCCESSFUL", 10)
    fields = {f.attname: getattr(template, f.attname) for f in Task._meta.concrete_fields}
    Task.objects.bulk_create(Task(**{**fields, "id": uuid.uuid4()}) for _ in range(1000))
    assert Task.objects.count() == 1001
    out = StringIO()
    with pytest.raises(CommandError, match=r"Refusing to delete 1,001 tasks.*--yes.*Nothing"):
        call_command("prunetasks", "--older-than", "7d", stdout=out)
    assert "About to delete 1,001 tasks finished more than 7d ago: SUCCESSFUL 1,001." in (
        out.getvalue()
    )
    assert Task.objects.count() == 1001
    _, out_yes = run("prunetasks", "--older-than", "7d", "--yes")
    assert "Deleted 1,001 tasks" in out_yes
    assert not Task.objects.exists()


@pytest.mark.parametrize("flag", ["--yes", "-y", "--no-input", "--noinput"])
def test_prunetasks_past_the_threshold_with_a_flag_asks_nothing(no_terminal, flag) -> None:
    for _ in range(3):
        _finished("FAILED", 10)
    young = _finished("FAILED", 1)
    with pytest.raises(CommandError, match="Refusing to delete 3 tasks"):
        call_command("prunetasks", "--older-than", "7d", "--confirm-above", "2", stdout=StringIO())
    assert Task.objects.count() == 4
    _, out = run("prunetasks", "--older-than", "7d", "--confirm-above", "2", flag)
    assert "Deleted 3 tasks" in out
    assert list(Task.objects.values_list("pk", flat=True)) == [young.pk]


def test_prunetasks_up_to_the_threshold_asks_nothing(no_terminal) -> None:
    for _ in range(2):
        _finished("SUCCESSFUL", 10)
    _, out = run("prunetasks", "--older-than", "7d", "--confirm-above", "2")
    assert "Deleted 2 tasks" in out and not Task.objects.exists()


def test_prunetasks_dry_run_never_asks(no_terminal) -> None:
    for _ in range(3):
        _finished("SUCCESSFUL", 10)
    _, out = run("prunetasks", "--older-than", "7d", "--confirm-above", "0", "--dry-run")
    assert out.startswith("Would delete 3 tasks")
    assert Task.objects.count() == 3


PRUNE_OLDER_THAN_7D = ("prunetasks", "--older-than", "7d")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("answer", "left"), [("yes", 1), ("n", 4), ("", 4)])
def test_prunetasks_asks_on_a_terminal(answer, left) -> None:
    """A real process whose stdin is a terminal: the answer decides."""
    for _ in range(3):
        _finished("SUCCESSFUL", 10)
    _finished("SUCCESSFUL", 1)
    master, slave = os.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "django", *PRUNE_OLDER_THAN_7D, "--confirm-above", "2"],
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={
                **os.environ,
                "RDBTASKS_TEST_WORKER": "1",
                "PYTHONPATH": str(ROOT),
                "DJANGO_SETTINGS_MODULE": "tests.settings",
            },
        )
        os.write(master, f"{answer}\n".encode())
        out, _ = process.communicate(timeout=120)
    finally:
        os.close(slave)
        os.close(master)
    text = out.decode()
    assert "About to delete 3 tasks" in text and "Type 'yes' to continue" in text
    if left == 1:
        assert process.returncode == 0 and "Deleted 3 tasks" in text
    else:
        assert process.returncode == 1 and "Nothing was deleted" in text
    assert Task.objects.count() == left


def test_prunetasks_by_setting(settings) -> None:
    settings.RDBTASKS_RETENTION = {"FAILED": "2d"}
    _finished("FAILED", 3)
    _finished("SUCCESSFUL", 300)
    _, out = run("prunetasks", "--by-setting", "--dry-run")
    assert "Would delete 1 FAILED task older than 2d" in out
    assert "  FAILED in queue default: 1" in out
    _, out = run("prunetasks", "--by-setting")
    assert "Deleted 1 task (FAILED 1)" in out
    assert Task.objects.get().status == "SUCCESSFUL"


def test_prunetasks_by_setting_asks_too(settings, no_terminal) -> None:
    settings.RDBTASKS_RETENTION = {"SUCCESSFUL": "1d"}
    for _ in range(3):
        _finished("SUCCESSFUL", 3)
    with pytest.raises(CommandError, match="Refusing to delete 3 tasks"):
        call_command("prunetasks", "--by-setting", "--confirm-above", "2", stdout=StringIO())
    assert Task.objects.count() == 3
    _, out = run("prunetasks", "--by-setting", "--confirm-above", "2", "--yes")
    assert "Deleted 3 tasks" in out and not Task.objects.exists()


@pytest.mark.parametrize("flag", ["--yes", "--no-input"])
def test_prunetasks_told_not_to_ask_counts_nothing_before_deleting(
    settings, monkeypatch, flag
) -> None:
    # On millions of finished rows the count is a scan of their index; with
    # nobody to show it to, the deletion alone runs.
    from django_rdbtasks.management.commands import prunetasks

    counted: list[tuple] = []
    count = prunetasks.count_prunable_by_queue

    def counting(*args, **kwargs):
        counted.append(args)
        return count(*args, **kwargs)

    monkeypatch.setattr(prunetasks, "count_prunable_by_queue", counting)
    for _ in range(3):
        _finished("SUCCESSFUL", 10)
    young = _finished("SUCCESSFUL", 1)
    _, out = run("prunetasks", "--older-than", "7d", "--confirm-above", "0", flag)
    assert "Deleted 3 tasks" in out and counted == []
    assert list(Task.objects.values_list("pk", flat=True)) == [young.pk]
    settings.RDBTASKS_RETENTION = {"SUCCESSFUL": "12h"}
    _, out = run("prunetasks", "--by-setting", "--confirm-above", "0", flag)
    assert "Deleted 1 task (" in out and counted == [] and not Task.objects.exists()
    _finished("SUCCESSFUL", 10)
    _, out = run("prunetasks", "--older-than", "7d", "--dry-run", flag)
    assert out.startswith("Would delete 1 task finished") and len(counted) == 1


@pytest.mark.parametrize("value", [7, "7", "1m"])
def test_prunetasks_by_setting_refuses_an_age_without_a_unit(settings, value) -> None:
    settings.RDBTASKS_RETENTION = {"SUCCESSFUL": value}
    _finished("SUCCESSFUL", 300)
    with pytest.raises(CommandError, match="RDBTASKS_RETENTION\\['SUCCESSFUL'\\]"):
        call_command("prunetasks", "--by-setting", "--yes", stdout=StringIO())
    assert Task.objects.count() == 1


# -- requeue -----------------------------------------------------------------------------------


def _failed(**fields) -> Task:
    return make_task(TaskStatus.FAILED, **fields)


def test_requeue_needs_a_filter_or_all() -> None:
    _failed()
    with pytest.raises(CommandError, match="Say which tasks"):
        call_command("requeue", stdout=StringIO())
    assert run("requeue", "--all")[1] == "Requeued 1 task.\n"
    assert Task.objects.get().status == TaskStatus.READY


def test_requeue_by_id_task_and_queue() -> None:
    a = _failed()
    b = _failed(task_path="tests.testapp.tasks.always_fails")
    c = _failed(queue_name="emails")
    d = _failed()
    run("requeue", str(a.pk))
    run("requeue", "--task", "tests.testapp.tasks.always_fails")
    run("requeue", "--queue", "emails")
    statuses = {t.pk: t.status for t in Task.objects.all()}
    assert [statuses[t.pk] for t in (a, b, c, d)] == ["READY", "READY", "READY", "FAILED"]
    with pytest.raises(CommandError, match="not a task id"):
        call_command("requeue", "nope", stdout=StringIO())


def test_requeue_by_time_range_dry_run_and_limit() -> None:
    moment = now()
    recent = [_failed(at=moment - dt.timedelta(minutes=m)) for m in (5, 10, 20)]
    old = _failed(at=moment - dt.timedelta(days=2))
    assert run("requeue", "--since", "1h", "--dry-run")[1] == "Would requeue 3 tasks.\n"
    assert Task.objects.filter(status=TaskStatus.READY).count() == 0
    until = (moment - dt.timedelta(days=1)).isoformat()
    assert run("requeue", "--until", until)[1] == "Requeued 1 task.\n"
    assert Task.objects.get(pk=old.pk).status == TaskStatus.READY
    until_7min = run("requeue", "--since", "1h", "--until", "7min", "--limit", "1")[1]
    assert until_7min == "Requeued 1 task.\n"
    left = Task.objects.filter(pk__in=[t.pk for t in recent], status=TaskStatus.FAILED).count()
    assert left == 2
    with pytest.raises(CommandError, match="neither an age"):
        call_command("requeue", "--since", "last tuesday", stdout=StringIO())


def test_requeue_cancelled_ones_only_when_asked() -> None:
    cancelled = make_task(TaskStatus.CANCELLED)
    run("requeue", "--all")
    assert Task.objects.get(pk=cancelled.pk).status == TaskStatus.CANCELLED
    run("requeue", "--all", "--status", "cancelled")
    assert Task.objects.get(pk=cancelled.pk).status == TaskStatus.READY


@pytest.mark.parametrize(("flag", "value"), [("--within", "0"), ("--timeout", "-5")])
def test_probe_refuses_a_time_that_is_not_positive(flag, value) -> None:
    with pytest.raises(CommandError, match=f"{flag} must be a positive number of seconds"):
        call_command("rdbtasks", "probe", "live", flag, value, stdout=StringIO())


# -- what holds back cleanup (issue 39, point 5) -----------------------------------------------


def test_status_shows_what_holds_back_cleanup_and_fails_max_xmin_age(vendor, monkeypatch) -> None:
    from django_rdbtasks import cleanup

    if vendor == "sqlite":
        # Nothing holds anything back there: no section, and the limit holds.
        code, out = run("rdbtasks", "status", "--max-xmin-age", "0")
        assert code == 0 and "Cleanup" not in out and "max_xmin_age: none" in out
        return
    monkeypatch.setattr(cleanup, "SHOWN_AFTER", 1.0)
    with held_snapshot(application="rdbtasks-status-test") as session:
        time.sleep(1.5)
        code, out = run("rdbtasks", "status", "--max-xmin-age", "1")
        assert code == 1, out
        assert "Cleanup: the oldest open transaction is " in out
        assert re.search(r"max_xmin_age: [\d.]+ \(must be <= 1\) FAILED", out), out
        holder = next(line for line in out.splitlines() if line.startswith(f"session {session} "))
        assert "idle in transaction" in holder
        if vendor == "postgresql":
            assert "rdbtasks-status-test" in holder
            assert "django_rdbtasks_task" in out  # its table's dead rows and vacuums
        else:
            assert "InnoDB history list length" in out
        assert run("rdbtasks", "status", "--max-xmin-age", "3600")[0] == 0
        data = json.loads(run("rdbtasks", "status", "--json", "--max-xmin-age", "1")[1])
    [check] = data["health"]["checks"]
    assert check["name"] == "MAX_XMIN_AGE" and check["value"] >= 1.5 and not check["ok"]
    [holder_data] = [h for h in data["cleanup"]["holders"] if h["name"] == session]
    assert holder_data["state"] == "idle in transaction" and holder_data["age"] >= 1.5
    if vendor == "postgresql":  # this database's sessions only: nothing else holds it
        assert run("rdbtasks", "status", "--max-xmin-age", "60")[0] == 0
