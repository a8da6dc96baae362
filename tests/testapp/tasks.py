"""Tasks the tests enqueue; their bodies leave countable side effects."""

import os
import time

from django.utils import timezone

from django_rdbtasks.compat import HAS_DJANGO_TASKS
from django_rdbtasks.db.functions import DbNow
from django_rdbtasks.limits import ConcurrencyLimit, RateLimit

from .models import LimitedRun, SideEffect

if HAS_DJANGO_TASKS:
    from django.tasks import task
else:
    from django_tasks import task


@task()
def add(a, b):
    return a + b


@task()
def noop():
    return None


@task()
def record(key):
    SideEffect.objects.create(key=key, pid=os.getpid())
    return key


@task(max_attempts=3, backoff=0)
def record_then_sleep(key, seconds):
    SideEffect.objects.create(key=key, pid=os.getpid())
    time.sleep(seconds)
    return key


@task(max_attempts=2, backoff=0)
def always_fails(message):
    raise ValueError(message)


@task(max_attempts=3, backoff=0)
def fails_until(key, successes_needed_after):
    """Fails while fewer than ``successes_needed_after`` earlier runs exist."""
    runs = SideEffect.objects.filter(key=key).count()
    SideEffect.objects.create(key=key, pid=os.getpid())
    if runs < successes_needed_after:
        raise RuntimeError(f"run {runs + 1} fails on purpose")
    return runs + 1


@task(takes_context=True)
def with_context(context, value):
    return {"attempt": context.attempt, "id": context.task_result.id, "value": value}


@task()
async def async_add(a, b):
    return a + b


@task()
def returns_object():
    return object()


@task(priority=10, queue_name="emails")
def send_email(to):
    SideEffect.objects.create(key=f"email:{to}", pid=os.getpid())


not_a_task = record.func


def plain_function():
    return "must never run"


@task(max_attempts=2)
def fails_with_default_backoff():
    raise ConnectionError("try again later")


@task(takes_context=True, max_attempts=3, backoff=0)
def slow_first_attempt(context, key, seconds):
    """Records each start; only the first attempt is slow, so a rerun finishes fast."""
    SideEffect.objects.create(
        key=key, pid=os.getpid(), worker_id=context.task_result.worker_ids[-1]
    )
    if context.attempt == 1:
        time.sleep(seconds)
    return {"attempt": context.attempt, "pid": os.getpid()}


@task()
def gc_thresholds():
    """The collector's thresholds in the process that ran this task."""
    import gc

    return list(gc.get_threshold())


@task()
def connection_identity():
    """Which server connection ran this task body."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0]
        if connection.vendor == "mysql":
            cursor.execute("SELECT CONNECTION_ID()")
            return cursor.fetchone()[0]
    return id(connection.connection)


@task()
def record_job(job):
    SideEffect.objects.create(key=f"job:{job}", pid=os.getpid())


@task(once_key="order:{order_id}")
def charge_order(order_id, amount):
    SideEffect.objects.create(key=f"charge:{order_id}", pid=os.getpid())
    return amount


@task(dedup_key="sync:{account}")
def sync_account(account):
    SideEffect.objects.create(key=f"sync:{account}", pid=os.getpid())


_singleton_running = 0
_singleton_peak = 0


@task(singleton=True)
def exclusive(key, seconds):
    global _singleton_running, _singleton_peak
    _singleton_running += 1
    _singleton_peak = max(_singleton_peak, _singleton_running)
    try:
        SideEffect.objects.create(key=key, pid=os.getpid())
        time.sleep(seconds)
    finally:
        _singleton_running -= 1
    return _singleton_peak


@task(takes_context=True, max_attempts=5, backoff=0)
def resumable(context, key, items, seconds):
    """Processes items from its checkpoint on; stops early when asked."""
    start = (context.checkpoint or {}).get("next", 0)
    for item in range(start, items):
        if context.should_stop():
            return "stopped"
        SideEffect.objects.create(key=f"{key}:{item}", pid=os.getpid())
        time.sleep(seconds)
        context.report_progress(
            done=item + 1, total=items, message=f"item {item}", checkpoint={"next": item + 1}
        )
    return "done"


@task(takes_context=True, backoff=0)
def rebalancing(context, key):
    start = (context.checkpoint or {}).get("next", 0)
    for item in range(start, 6):
        SideEffect.objects.create(key=f"{key}:{item}", pid=os.getpid())
        context.save_checkpoint({"next": item + 1}, force=True)
        if item == 2 and context.attempt == 1 and start == 0:
            context.hand_over(delay=0.2)
    return start


@task(takes_context=True, max_attempts=1, timeout=0.5)
def until_stopped(context, key):
    SideEffect.objects.create(key=key, pid=os.getpid())
    while not context.should_stop():
        time.sleep(0.02)
    return "stopped"


@task(max_attempts=2, backoff=0, timeout=0.5)
def ignores_timeout(key, seconds):
    SideEffect.objects.create(key=key, pid=os.getpid())
    time.sleep(seconds)


@task()
def step(name, seconds=0.0):
    SideEffect.objects.create(key=f"step:{name}", pid=os.getpid())
    time.sleep(seconds)
    return name


@task(takes_context=True)
def reports_progress(context, steps):
    """Reports progress with a checkpoint each step; stops as soon as it is asked to."""
    for done in range(steps):
        if context.should_stop():
            return f"stopped after {done}"
        context.report_progress(
            done=done + 1, total=steps, checkpoint={"done": done + 1}, force=True
        )
    return "done"


@task(priority=10)
def waits_for(keys, timeout):
    """Runs until every key has a SideEffect; fails if that takes longer than ``timeout``."""
    SideEffect.objects.create(key="waiting", pid=os.getpid())
    deadline = time.monotonic() + timeout
    while SideEffect.objects.filter(key__in=keys).count() < len(keys):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{keys} never ran while this task was running")
        time.sleep(0.02)
    return "seen"


#: Connections ``locks_row`` left open, holding their row locks, for the test
#: (running the worker in its own process) to roll back.
held_row_locks = []


@task()
def locks_row(task_id):
    """Lock another task's row on a connection of its own and leave it locked."""
    import uuid

    from django.db import connections

    from django_rdbtasks.models import Task

    holder = connections.create_connection("default")
    holder.inc_thread_sharing()  # ended by the test's thread
    holder.set_autocommit(False)
    with holder.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {Task._meta.db_table} WHERE id = %s FOR UPDATE",
            [Task._meta.pk.get_db_prep_value(uuid.UUID(task_id), holder)],
        )
    held_row_locks.append(holder)


@task()
def connection_options():
    """The driver options of the connection this task body uses."""
    from django.db import connection

    return {key: str(value) for key, value in connection.settings_dict.get("OPTIONS", {}).items()}


@task(limit=ConcurrencyLimit(3, key="tenant:{tenant}"), max_attempts=5)
def per_tenant(tenant, seconds):
    """At most 3 per tenant at once: records when it ran, by the database clock."""
    run = LimitedRun.objects.create(key=tenant, pid=os.getpid(), started_at=DbNow())
    time.sleep(seconds)
    LimitedRun.objects.filter(pk=run.pk).update(finished_at=DbNow())
    return tenant


@task(limit=RateLimit(20, period=1.0, key="provider"))
def rated(n):
    """At most 20 starts a second, cluster-wide: the body's start, by its own clock.

    The tests run every worker on one machine, so the processes' wall clocks
    are one clock, read as the body begins (what a rate-limited API counts).
    """
    started = timezone.now()
    LimitedRun.objects.create(key="rated", pid=os.getpid(), started_at=started)
    return n


@task(limit=RateLimit(20, period=1.0, key="slow-provider"))
def rated_sleep(n, seconds):
    """A rate-limited call that takes a while: its start by the body's clock, then it sleeps."""
    started = timezone.now()
    LimitedRun.objects.create(key="rated_sleep", pid=os.getpid(), started_at=started)
    time.sleep(seconds)
    return n


#: Where ``limited_sleep`` and ``unlimited_sleep`` record their runs when set: a
#: line in their process's own file, not a row (issue 42's scenario, whose
#: tasks only sleep: a row's INSERT and commit would load the server it
#: measures, inside each body's hold on its slot after its end was taken).
RUNS_DIR_VARIABLE = "RDBTASKS_TEST_RUNS_DIR"


def record_run(key, started):
    """One run, its start and end by the body's own clock: a line in the process's
    file under ``RUNS_DIR_VARIABLE`` where it is set, else a ``LimitedRun`` row."""
    finished = timezone.now()
    runs_dir = os.environ.get(RUNS_DIR_VARIABLE)
    if runs_dir:
        with open(os.path.join(runs_dir, f"{os.getpid()}.txt"), "a") as runs:
            runs.write(f"{key} {started.isoformat()} {finished.isoformat()}\n")
    else:
        LimitedRun.objects.create(
            key=key, pid=os.getpid(), started_at=started, finished_at=finished
        )


@task(limit=ConcurrencyLimit(3, key="acc-conc:{group}"))
def limited_sleep(group, n, seconds=0.04):
    """Three at a time per group: its start and end by its own clock, at its end."""
    started = timezone.now()
    time.sleep(seconds)
    record_run(f"group:{group}", started)
    return n


@task()
def unlimited_sleep(n, seconds=0.01):
    """No limit: its start and end, as ``limited_sleep`` records them."""
    started = timezone.now()
    time.sleep(seconds)
    record_run("free", started)
    return n


@task(limit=RateLimit(20, period=3600.0, key="provider"))
def metered(n):
    """At most 20 starts an hour: a window no slow test run outlasts."""
    return n


@task(limit=ConcurrencyLimit(2, key=lambda customer, **_: f"customer:{customer}"))
def per_customer(customer, seconds=0.0):
    time.sleep(seconds)
    return customer


@task(takes_context=True, limit=ConcurrencyLimit(1, key="solo"))
def solo(context, key, seconds):
    """One at a time: only the first attempt is slow, so a rerun after a crash is quick."""
    run = LimitedRun.objects.create(key=key, pid=os.getpid(), started_at=DbNow())
    if context.attempt == 1:
        time.sleep(seconds)
    LimitedRun.objects.filter(pk=run.pk).update(finished_at=DbNow())
    return context.attempt


@task()
def leaves_transaction_open(key):
    """Writes a row and never commits: its transaction must not outlive the task."""
    from django.db import transaction

    transaction.atomic().__enter__()
    SideEffect.objects.create(key=key)


# -- data a database refuses (issue 37) ---------------------------------------------------
# Built inside the task: as arguments they would be refused at enqueue.


@task()
def length(text):
    return len(text)


@task(max_attempts=1)
def raises_nul():
    SideEffect.objects.create(key="raises_nul", pid=os.getpid())
    raise ValueError("bad byte: \x00")


@task(max_attempts=1)
def returns_nul():
    SideEffect.objects.create(key="returns_nul", pid=os.getpid())
    return "a\x00b"


@task()
def returns_big(size):
    """Returns ``size`` bytes of JSON (a string of ``size - 2`` characters)."""
    SideEffect.objects.create(key="returns_big", pid=os.getpid())
    return "y" * (size - 2)


@task(takes_context=True, max_attempts=2, backoff=0)
def handles_payload(context, action, payload_json, pad, key):
    """Does ``action`` with the payload JSON decodes to (NULs and lone surrogates
    included), padded with ``pad`` characters if ``pad``: returns it, raises it,
    reports it as progress or saves it as the checkpoint. One SideEffect per run,
    keyed ``key``."""
    import json

    SideEffect.objects.create(key=key, pid=os.getpid())
    payload = json.loads(payload_json)
    if pad:
        payload = [payload, "y" * pad]
    if action == "return":
        return payload
    if action == "raise":
        raise ValueError(payload)
    if action == "progress":
        context.report_progress(0.5, message=str(payload), force=True)
        return "reported"
    if action == "checkpoint":
        context.save_checkpoint(payload, force=True)
        return "saved"
    raise AssertionError(action)


@task(takes_context=True)
def checkpoints(context, value):
    """Saves ``value`` (or NUL text, for "nul") as its checkpoint, then returns "saved"."""
    context.save_checkpoint("a\x00b" if value == "nul" else value, force=True)
    return "saved"


def built(kind, size):
    return {"nul": "a\x00b", "surrogate": "a\ud800b", "big": "y" * size}[kind]


@task()
def returns_built(kind, size=0):
    """Returns text no database stores as it is: with a NUL, a lone surrogate, or big."""
    return built(kind, size)


@task()
def raises_built(kind, size=0):
    raise ValueError(built(kind, size))
