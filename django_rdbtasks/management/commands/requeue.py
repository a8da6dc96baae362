"""``manage.py requeue``: run failed tasks again, by id, task, queue or time range."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import QuerySet

from ... import bulk_requeue, snapshots
from ...compat import task_backends
from ...durations import FORMS, parse_age
from ...exceptions import InvalidTaskPath
from ...jobs import database_now
from ...loading import load_task
from ...models import Task, TaskStatus, task_path_in
from ...suggest import did_you_mean
from ..text import counted, refuse

#: Rows whose task paths a typo is compared with (the newest).
SAMPLE = 2000


class Command(BaseCommand):
    help = (
        f"Requeue failed (or cancelled) tasks: {TaskStatus.READY.value} now, with fresh "
        "attempts; their history is kept. Select them by id, task, queue and when they finished."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="*", metavar="TASK_ID", help="Task ids to requeue.")
        parser.add_argument(
            "--task",
            action="append",
            dest="tasks",
            metavar="PATH",
            help="Only this task path (myapp.tasks.send_invoice); repeatable.",
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME",
            help="Only this queue; repeatable.",
        )
        parser.add_argument(
            "--since",
            metavar="WHEN",
            help="Finished at or after: an age (2h, 3d) or an ISO 8601 time.",
        )
        parser.add_argument(
            "--until", metavar="WHEN", help="Finished before: an age (30m) or an ISO 8601 time."
        )
        parser.add_argument(
            "--status",
            action="append",
            dest="statuses",
            type=str.upper,
            choices=[TaskStatus.FAILED.value, TaskStatus.CANCELLED.value],
            help=f"{TaskStatus.FAILED.value} (the default) or {TaskStatus.CANCELLED.value}; "
            "repeat for both.",
        )
        parser.add_argument(
            "--all",
            action="store_true",
            help="Requeue every matching task even with no other filter.",
        )
        parser.add_argument("--limit", type=int, help="Requeue at most this many.")
        parser.add_argument(
            "--dry-run", action="store_true", help="Count the matching tasks; change nothing."
        )
        parser.add_argument("--database", default=None, help="The database alias of the tasks.")
        parser.add_argument(
            "--user",
            metavar="USERNAME",
            help="Act as this user: only the queues RDBTASKS_QUEUE_PERMISSIONS gives them, "
            "and only with the permission to retry tasks. Logged in the admin log as theirs.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self._refuse_bad_arguments(options)
        user = self._user(options["user"]) if options["user"] else None
        selected = self.select(options)
        visible: QuerySet[Task] = Task.objects.using(
            options["database"] or snapshots.default_database()
        )
        if user is not None:
            from ...admin.permissions import access_for

            selected = access_for(user).filter(selected)
            visible = access_for(user).filter(visible)
        self.refuse_unknown(options, visible)
        if options["dry_run"]:
            count = snapshots.capped_count(selected)
            about = "more than " if count.estimate else ""
            self.stdout.write(f"Would requeue {about}{counted(count.value, 'task')}.")
            return
        on_batch = None
        if user is not None:
            from django.contrib.admin.models import CHANGE, LogEntry

            def on_batch(batch: list[bulk_requeue.Requeued]) -> None:
                for item in batch:
                    LogEntry.objects.log_actions(
                        user.pk,
                        [Task(pk=item.id, task_path=item.task_path)],
                        CHANGE,
                        f"Requeued (was {item.was}) with manage.py requeue.",
                    )

        requeued = bulk_requeue.requeue_tasks(selected, limit=options["limit"], on_batch=on_batch)
        self.stdout.write(f"Requeued {counted(requeued, 'task')}.")

    def _refuse_bad_arguments(self, options: dict[str, Any]) -> None:
        """What the arguments themselves get wrong, all of it at once, before any query."""
        problems = []
        has_filter = any(options[k] for k in ("ids", "tasks", "queues", "since", "until"))
        if not has_filter and not options["all"]:
            problems.append(
                "Say which tasks: ids, --task, --queue, --since/--until, or --all for every one."
            )
        problems += [
            f"{value!r} is not a task id." for value in options["ids"] if not _is_uuid(value)
        ]
        for flag in ("since", "until"):
            if options[flag]:
                try:
                    _when(options[flag])
                except ValueError as exc:
                    problems.append(f"--{flag}: {exc}")
        if options["limit"] is not None and options["limit"] < 1:
            problems.append(f"--limit must be at least 1, not {options['limit']}.")
        refuse(problems)

    @staticmethod
    def _user(username: str) -> Any:
        from django.contrib.auth import get_user_model

        model = get_user_model()
        try:
            user = model._default_manager.get_by_natural_key(username)
        except model.DoesNotExist as exc:
            raise CommandError(f"No user {username!r}.") from exc
        if not user.is_active or not user.has_perm("django_rdbtasks.retry_task"):
            raise CommandError(f"{username!r} may not retry tasks (django_rdbtasks.retry_task).")
        return user

    def select(self, options: dict[str, Any]) -> QuerySet[Task]:
        using = options["database"] or snapshots.default_database()
        statuses = options["statuses"] or [TaskStatus.FAILED]
        tasks = Task.objects.using(using).filter(status__in=statuses)
        if options["ids"]:
            tasks = tasks.filter(pk__in=[uuid.UUID(value) for value in options["ids"]])
        if options["tasks"]:
            tasks = tasks.filter(task_path_in(options["tasks"]))
        if options["queues"]:
            tasks = tasks.filter(queue_name__in=options["queues"])
        if options["since"] or options["until"]:
            now = database_now(using)
            if options["since"]:
                tasks = tasks.filter(finished_at__gte=_when(options["since"], now))
            if options["until"]:
                tasks = tasks.filter(finished_at__lt=_when(options["until"], now))
        return tasks

    def refuse_unknown(self, options: dict[str, Any], visible: QuerySet[Task]) -> None:
        """A typo must not read as "Requeued 0 tasks.": name what matches nothing.

        An id is unknown if no task has it; a task path if no task has it and it
        names no task in the code; a queue if no backend has it in QUEUES and no
        task is in it. An id that exists in another status is only reported.
        """
        problems = []
        ids = [uuid.UUID(value) for value in options["ids"]]
        if ids:
            found = dict(visible.filter(pk__in=ids).values_list("pk", "status"))
            missing = [str(pk) for pk in ids if pk not in found]
            if missing:
                problems.append(f"No task has the id {', '.join(missing)}.")
            statuses = options["statuses"] or [TaskStatus.FAILED]
            for pk, status in found.items():
                if status not in statuses:
                    self.stderr.write(f"Task {pk} is {status}, not {' or '.join(statuses)}.")
        for path in options["tasks"] or []:
            if not visible.filter(task_path_in([path])).exists() and not _names_a_task(path):
                problems.append(
                    f"No task has the path {path!r}, and it names no task."
                    + did_you_mean(path, _known_paths(visible))
                )
        problems += snapshots.unknown_queue_problems(
            options["queues"] or [], visible, _configured_queues()
        )
        refuse(problems)


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _when(value: str, now: dt.datetime | None = None) -> dt.datetime:
    """An ISO 8601 time (UTC if it names none), or an age back from ``now``, the database clock.

    ``ValueError`` says what is accepted; without ``now`` the value is only checked.
    """
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        pass
    else:
        return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
    try:
        age = parse_age(value)
    except ValueError as exc:
        if "too long" in str(exc):
            raise
        raise ValueError(
            f"{value!r} is neither an age ({FORMS.split(' (')[0]}) nor an ISO 8601 time."
        ) from None
    return (now or dt.datetime.now(dt.UTC)) - age


def _names_a_task(path: str) -> bool:
    try:
        load_task(path)
    except InvalidTaskPath:
        return False
    return True


def _known_paths(visible: QuerySet[Task]) -> list[str]:
    """Task paths to suggest instead of a typo: those of the newest rows, read by primary key.

    A sample, as the admin's task filter takes: the distinct paths of every row
    would be a read of the whole table."""
    newest = visible.order_by("-pk").values_list("task_path", flat=True)[:SAMPLE]
    return sorted(set(newest))


def _configured_queues() -> set[str]:
    from ...backend import RDBTaskBackend

    queues: set[str] = set()
    for alias in task_backends:
        backend = task_backends[alias]
        if isinstance(backend, RDBTaskBackend):
            queues |= backend.queues
    return queues
