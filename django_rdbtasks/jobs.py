"""Cron jobs: declared in code or in the admin, fired once per tick by any number of schedulers.

A due job is fired by a compare-and-set on its ``version`` that also moves
``next_run_at`` to the following tick; only the scheduler whose update matched
writes the tick's ``JobRecord`` and enqueues the task, all in one transaction.

Jobs declared in code are re-declared by every live scheduler every minute
(``last_declared_at``, the database's clock). One that no scheduler has declared
for ``RDBTASKS_RETIRE_AFTER`` seconds was removed from the code everywhere: it
is retired (``retired_at``) and never fires again, unless code declares it again.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from zoneinfo import ZoneInfo

from cronsim import CronSim
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import DatabaseError, IntegrityError, connections, router, transaction
from django.db.models import F

from .compat import TASK_BASE_CLASSES, Task
from .conf import JOBS, RETIRE_AFTER, project_settings
from .db import dialect_for
from .db.functions import DbNow
from .exceptions import InvalidTaskPath
from .job_validation import validate_cron, validate_timezone
from .loading import load_task
from .models import Job, JobRecord, MisfirePolicy
from .states import TaskStatus
from .suggest import did_you_mean

logger = logging.getLogger("django_rdbtasks.scheduler")

# -- cron arithmetic ----------------------------------------------------------------


def next_tick(cron: str, timezone: str, after: dt.datetime) -> dt.datetime:
    """The first tick strictly after ``after``, in UTC.

    Ticks are computed in the job's time zone, so "every day at 02:30" follows
    local time across DST changes: a skipped 02:30 fires at 03:00, a repeated
    hour fires once.
    """
    local = after.astimezone(ZoneInfo(timezone))
    return next(iter(CronSim(cron, local))).astimezone(dt.UTC)


def upcoming_ticks(cron: str, timezone: str, after: dt.datetime, count: int) -> list[dt.datetime]:
    ticks = CronSim(cron, after.astimezone(ZoneInfo(timezone)))
    return [next(ticks).astimezone(dt.UTC) for _ in range(count)]


def tick_key(tick: dt.datetime) -> str:
    """The JobRecord key of a tick: its UTC time, to the second."""
    return tick.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def database_now(using: str) -> dt.datetime:
    connection = connections[using]
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        return dialect.decode_dt(dialect.current_time(cursor))  # type: ignore[return-value]


# -- jobs declared in code ---------------------------------------------------------------


@dataclass(frozen=True)
class JobSpec:
    name: str
    task_path: str
    cron: str
    timezone: str = "UTC"
    kwargs: dict[str, Any] = field(default_factory=dict)
    misfire_policy: str = MisfirePolicy.RUN_ONCE
    queue_name: str = ""
    priority: int | None = None
    enabled: bool = True

    def validate(self) -> None:
        """Every problem of the declaration at once (one ``ValidationError``).

        Not the task path nor the queue: those need the apps loaded and the
        task imported, and the system check asks them (``validate_job_target``).
        """
        problems = [
            f"{name} must be {kind}, not {getattr(self, name)!r}."
            for name, kind, valid in (
                ("cron", "a cron expression (text)", isinstance(self.cron, str)),
                ("timezone", "a time zone name", isinstance(self.timezone, str)),
                # Every tick would fail to enqueue: a task takes keyword arguments by name.
                ("kwargs", "a dict of keyword arguments", isinstance(self.kwargs, dict)),
                ("queue_name", "a queue name (text)", isinstance(self.queue_name, str)),
                (
                    "priority",
                    "a whole number or None",
                    self.priority is None
                    or (isinstance(self.priority, int) and not isinstance(self.priority, bool)),
                ),
                ("enabled", "True or False", isinstance(self.enabled, bool)),
            )
            if not valid
        ]
        for name, check in (("cron", validate_cron), ("timezone", validate_timezone)):
            if isinstance(getattr(self, name), str):
                try:
                    check(getattr(self, name))
                except ValidationError as exc:
                    problems += exc.messages
        if self.misfire_policy not in MisfirePolicy.values:
            problems.append(
                f"misfire_policy must be one of {MisfirePolicy.values}, "
                f"not {self.misfire_policy!r}."
            )
        if isinstance(self.kwargs, dict):
            try:
                json.dumps(self.kwargs)
            except (TypeError, ValueError) as exc:
                problems.append(f"kwargs must be JSON (a job's row keeps them): {exc}.")
        if problems:
            raise ValidationError(problems)


_decorated: dict[str, JobSpec] = {}


def periodic(
    cron: str,
    *,
    name: str | None = None,
    timezone: str = "UTC",
    kwargs: dict[str, Any] | None = None,
    misfire_policy: str = MisfirePolicy.RUN_ONCE,
    queue_name: str = "",
    priority: int | None = None,
) -> Callable[[Task], Task]:
    """Declare a Job for the task below it (put it above ``@task``)::

    @periodic("0 3 * * *", timezone="Europe/Berlin")
    @task()
    def nightly_report(): ...
    """
    if not isinstance(cron, str):  # @periodic with no parentheses
        raise TypeError(
            f"@periodic needs a cron expression, not {_name_of(cron)}: "
            '@periodic("0 3 * * *") above @task().'
        )

    def declare(task: Task) -> Task:
        if not isinstance(task, TASK_BASE_CLASSES):
            raise ImproperlyConfigured(
                f"@periodic on {_name_of(task)}: it needs a task, made with @task(); "
                "put @periodic above @task()."
            )
        spec = JobSpec(
            name=name or task.module_path,
            task_path=task.module_path,
            cron=cron,
            timezone=timezone,
            # A copy of a dict; anything else as given, for validate() to name.
            kwargs=dict(kwargs) if isinstance(kwargs, dict) else {} if kwargs is None else kwargs,
            misfire_policy=misfire_policy,
            queue_name=queue_name,
            priority=priority,
        )
        try:
            spec.validate()
        except ValidationError as exc:
            raise ImproperlyConfigured(
                f"@periodic on {task.module_path}: {' '.join(exc.messages)}"
            ) from exc
        _decorated[spec.name] = spec
        return task

    return declare


def _name_of(thing: Any) -> str:
    if isinstance(thing, TASK_BASE_CLASSES):
        return f"the task {cast(Task, thing).module_path}"
    module = getattr(thing, "__module__", None)
    name = getattr(thing, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(thing)


#: The keys of an ``RDBTASKS_JOBS`` entry (``task`` or ``task_path``; the name is its key).
JOB_SETTING_KEYS = (
    "task",
    "task_path",
    "cron",
    "timezone",
    "kwargs",
    "misfire_policy",
    "queue_name",
    "priority",
    "enabled",
)


def read_declared_jobs() -> tuple[dict[str, JobSpec], dict[str, list[str]]]:
    """The jobs of ``RDBTASKS_JOBS`` and ``@periodic`` (the setting wins), and the problems.

    Problems are by job name (``""``: the setting as a whole). A job with a
    problem of its setting's shape (an unknown key, no task, no cron) is left
    out of the jobs; every other job is still read, so that one typo does not
    hide the other jobs' errors.
    """
    jobs = dict(_decorated)
    problems: dict[str, list[str]] = {}
    # The setting as a whole (not a dict) is conf.py's to report (E010).
    for name, options in project_settings().jobs.items():
        if not isinstance(options, Mapping):
            problems[str(name)] = [
                f"must be a dict like {{'task': 'app.tasks.function', 'cron': '0 3 * * *'}}, "
                f"not {options!r}."
            ]
            continue
        found = [
            f"{key!r} is not a job's setting (it takes {', '.join(JOB_SETTING_KEYS)})."
            + (
                " A job's name is its key in RDBTASKS_JOBS."
                if key == "name"
                else did_you_mean(str(key), JOB_SETTING_KEYS)
            )
            for key in options
            if key not in JOB_SETTING_KEYS
        ]
        values = {key: value for key, value in options.items() if key in JOB_SETTING_KEYS}
        task_path = values.pop("task", None) or values.pop("task_path", None)
        values.pop("task_path", None)
        if not task_path:
            found.append("it names no task ('task': 'app.tasks.function').")
        if "cron" not in values:
            found.append("it has no cron expression ('cron': '0 3 * * *').")
        if found:
            problems[str(name)] = found
            jobs.pop(name, None)  # not a @periodic's of the same name either: the setting wins
            continue
        jobs[name] = JobSpec(name=name, task_path=task_path, **values)
    return jobs, problems


def declared_jobs() -> dict[str, JobSpec]:
    """Jobs from the ``RDBTASKS_JOBS`` setting and from ``@periodic``; the setting wins.

    ``ImproperlyConfigured`` names every problem of the setting at once
    (``manage.py check`` reports them before a scheduler ever gets here).
    """
    project_settings().require(JOBS)
    jobs, problems = read_declared_jobs()
    if problems:
        raise ImproperlyConfigured(
            "RDBTASKS_JOBS: "
            + " ".join(
                f"{f'job {name!r}: ' if name else ''}{' '.join(found)}"
                for name, found in problems.items()
            )
        )
    return jobs


def sync_declared_jobs(using: str = "default", jobs: Mapping[str, JobSpec] | None = None) -> None:
    """Create or update the Job rows of jobs declared in code (``jobs``, default: all).

    An operator's pause (``enabled``) is never overwritten; a changed schedule
    takes effect from the next tick. A retired job declared again is live again,
    from its next tick (the ticks it missed while retired are not owed). Every
    job synced counts as declared now.
    """
    specs = declared_jobs() if jobs is None else jobs
    now = database_now(using)
    rows = Job.objects.using(using)
    for spec in specs.values():
        wanted = {
            "task_path": spec.task_path,
            "cron": spec.cron,
            "timezone": spec.timezone,
            "kwargs": spec.kwargs,
            "misfire_policy": spec.misfire_policy,
            "queue_name": spec.queue_name,
            "priority": spec.priority,
        }
        job = rows.filter(name=spec.name).first()
        if job is None:
            try:
                with transaction.atomic(using=using):
                    rows.create(
                        name=spec.name,
                        enabled=spec.enabled,
                        next_run_at=next_tick(spec.cron, spec.timezone, now),
                        from_code=True,
                        last_declared_at=DbNow(),
                        **wanted,
                    )
                logger.info("job %s created from code", spec.name)
            except IntegrityError:
                pass  # another worker created it at the same moment
            continue
        changed: dict[str, Any] = {k: v for k, v in wanted.items() if getattr(job, k) != v}
        retired = job.retired_at is not None
        if not changed and job.from_code and not retired:
            continue
        if (
            "cron" in changed
            or "timezone" in changed
            or job.next_run_at is None
            or (retired and job.next_run_at <= now)
        ):
            changed["next_run_at"] = next_tick(spec.cron, spec.timezone, now)
        updated = rows.filter(pk=job.pk, version=job.version).update(
            **changed,
            from_code=True,
            # In the same statement as un-retiring: a sweep running meanwhile
            # must not see it live and undeclared, and retire it again.
            retired_at=None,
            last_declared_at=DbNow(),
            version=F("version") + 1,
        )
        if updated and retired:
            logger.warning("job %s is declared again: no longer retired", spec.name)
        elif updated:
            logger.info("job %s updated from code: %s", spec.name, ", ".join(sorted(changed)))
    declare_jobs(list(specs), using=using)


def declare_jobs(names: list[str], *, using: str = "default") -> int:
    """Record that a live scheduler declares these jobs now, in one UPDATE.

    Returns how many live code jobs it touched: fewer than ``names`` means a
    row is missing (deleted by an operator), retired or not from code, and
    only ``sync_declared_jobs`` puts that right.
    """
    if not names:
        return 0
    return (
        Job.objects.using(using)
        .filter(name__in=names, from_code=True, retired_at__isnull=True)
        .update(last_declared_at=DbNow())
    )


def redeclare_jobs(using: str = "default", jobs: Mapping[str, JobSpec] | None = None) -> None:
    """A scheduler's periodic declaration: one UPDATE, a full sync only if rows are off."""
    specs = declared_jobs() if jobs is None else jobs
    if declare_jobs(list(specs), using=using) < len(specs):
        sync_declared_jobs(using, specs)


_warned_retire_after: set[str] = set()


def retire_after() -> float:
    """``RDBTASKS_RETIRE_AFTER`` in seconds (default 600), never below ``MIN_RETIRE_AFTER``."""
    configured = project_settings()
    configured.require(RETIRE_AFTER)
    for problem in configured.problems_of(RETIRE_AFTER, warnings=True):
        if problem.message not in _warned_retire_after:  # once, not every minute
            _warned_retire_after.add(problem.message)
            logger.warning("%s", problem.message)
    return configured.retire_after


def retire_undeclared_jobs(using: str = "default", *, after: float | None = None) -> list[str]:
    """Retire the code jobs no live scheduler declared for ``after`` seconds.

    ``after`` defaults to ``retire_after()``. The database's clock decides. A
    retired job keeps its row and history, never fires, and comes back if code
    declares it again. Jobs created in the admin are never retired. Returns the
    names this call retired.
    """
    window = dt.timedelta(seconds=retire_after() if after is None else after)
    live = Job.objects.using(using).filter(from_code=True, retired_at__isnull=True)
    # Rows synced before declarations were recorded (or by older code that does
    # not record them): their window starts now, not at some unknown past.
    live.filter(last_declared_at__isnull=True).update(last_declared_at=DbNow())
    stale = live.filter(last_declared_at__lt=DbNow() - window)
    retired = []
    # Rare, and each name is logged: one UPDATE per job, each re-checking the
    # condition so a declaration that lands meanwhile wins.
    for pk, name in stale.values_list("pk", "name"):
        if stale.filter(pk=pk).update(retired_at=DbNow(), version=F("version") + 1):
            retired.append(name)
            logger.warning(
                "job %s retired: no live scheduler has declared it for %ss",
                name,
                int(window.total_seconds()),
            )
    return retired


# -- firing ------------------------------------------------------------------------------


def fire_due_jobs(*, using: str | None = None, limit: int = 100) -> int:
    """Fire every due job this scheduler wins; return how many ticks it fired."""
    alias = using or router.db_for_write(Job)
    due = list(Job.objects.using(alias).due().order_by("next_run_at")[:limit])
    random.shuffle(due)  # schedulers racing over the same jobs mostly pick different ones
    return sum(fire(job, using=alias) for job in due)


def fire(job: Job, *, using: str) -> bool:
    """Preempt one due tick of ``job`` by CAS and, if won, record and enqueue it.

    All in one transaction: a crash anywhere leaves the tick as it was, for
    another scheduler to fire.
    """
    grace = project_settings().misfire_grace
    with transaction.atomic(using=using):
        now = database_now(using)
        tick = job.next_run_at
        assert tick is not None
        following = next_tick(job.cron, job.timezone, tick)
        missed_several = following <= now
        late = (now - tick).total_seconds() > grace
        if missed_several:
            next_run = next_tick(job.cron, job.timezone, now)
        else:
            next_run = following
        run = not (job.misfire_policy == MisfirePolicy.SKIP and (missed_several or late))
        won = (
            Job.objects.using(using)
            .filter(pk=job.pk, version=job.version, enabled=True, retired_at__isnull=True)
            .update(
                next_run_at=next_run,
                last_run_at=tick if run else F("last_run_at"),
                version=F("version") + 1,
            )
        )
        if not won:
            return False
        if not run:
            logger.info(
                "job %s: tick %s missed, skipped (next %s)", job.name, tick_key(tick), next_run
            )
            return False
        return _record_and_enqueue(job, tick, using)


def _record_and_enqueue(job: Job, tick: dt.datetime, using: str) -> bool:
    from .backend import RDBTaskBackend

    try:
        with transaction.atomic(using=using):
            record = JobRecord.objects.using(using).create(
                job_name=job.name, key=tick_key(tick), scheduled_for=tick
            )
    except IntegrityError:
        # Already fired (the job was edited back to an old tick): once only.
        logger.warning("job %s: tick %s was already fired", job.name, tick_key(tick))
        return False
    try:
        task = load_task(job.task_path)
        backend = task.get_backend()
        if not isinstance(backend, RDBTaskBackend):
            raise InvalidTaskPath(f"{job.task_path!r} does not use an RDBTaskBackend.")
        overrides: dict[str, Any] = {}
        if job.queue_name:
            overrides["queue_name"] = job.queue_name
        if job.priority is not None:
            overrides["priority"] = job.priority
        task = task.using(**overrides) if overrides else task
        result = backend.enqueue_job_task(task, job.kwargs, job_name=job.name)
    except Exception as exc:
        if isinstance(exc, DatabaseError):
            # The tick's transaction is broken (on Galera: rolled back by a
            # conflicting write that won on another node): undo the whole
            # tick, record included; the scheduler's retry fires it again.
            raise
        # The tick is spent either way; say why nothing ran, in its record.
        JobRecord.objects.using(using).filter(pk=record.pk).update(
            status=TaskStatus.FAILED, error=f"{type(exc).__name__}: {exc}"
        )
        logger.error("job %s: tick %s could not enqueue: %s", job.name, tick_key(tick), exc)
        return True
    JobRecord.objects.using(using).filter(pk=record.pk).update(task_id=result.id)
    logger.info("job %s: tick %s fired, task %s", job.name, tick_key(tick), result.id)
    return True
