"""Per-queue permissions: which queues (and so which tasks and jobs) a user may see and act on.

Teams own their queues. ``RDBTASKS_QUEUE_PERMISSIONS`` maps a queue to the
groups allowed to see it and to act on its tasks and jobs (with the model
permissions they need as ever)::

    RDBTASKS_QUEUE_PERMISSIONS = {
        "emails": ["mailing"],
        "reports": ["analysts", "ops"],
        "*": ["ops"],  # every queue not listed; leave it out to keep those open
    }

A queue the setting does not list falls under ``"*"``, or is open to every
staff user with the model permissions when there is no ``"*"``. Superusers
see everything. Without the setting, nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db.models import Q, QuerySet

from ..conf import QUEUE_PERMISSIONS, project_settings
from ..exceptions import InvalidTaskPath
from ..loading import load_task

_QS = TypeVar("_QS", bound=QuerySet[Any])

SETTING = QUEUE_PERMISSIONS
OTHER_QUEUES = "*"
#: A job whose task cannot be loaded any more counts as of this queue.
FALLBACK_QUEUE = "default"


def queue_permissions() -> dict[str, frozenset[str]]:
    configured = project_settings()
    configured.require(SETTING)
    return dict(configured.queue_permissions)


@dataclass(frozen=True, slots=True)
class QueueAccess:
    """The queues one user may see: an allow-list, or everything but a deny-list."""

    #: None: every queue except ``denied``.
    allowed: frozenset[str] | None = None
    denied: frozenset[str] = frozenset()

    @property
    def unrestricted(self) -> bool:
        return self.allowed is None and not self.denied

    def permits(self, queue: str) -> bool:
        if self.allowed is not None:
            return queue in self.allowed
        return queue not in self.denied

    def q(self, field: str = "queue_name") -> Q:
        """The condition on ``field`` (a queue name); a NULL passes only a deny-list."""
        if self.allowed is not None:
            return Q(**{f"{field}__in": sorted(self.allowed)})
        if self.denied:
            return ~Q(**{f"{field}__in": sorted(self.denied)})
        return Q()

    def filter(self, queryset: QuerySet, field: str = "queue_name") -> QuerySet:
        return queryset if self.unrestricted else queryset.filter(self.q(field))

    def narrow(self, queues: Iterable[str]) -> list[str]:
        return [queue for queue in queues if self.permits(queue)]


UNRESTRICTED = QueueAccess()


def access_for(user: Any) -> QueueAccess:
    """What ``user`` may see; computed once per user object (so once per request)."""
    cached = getattr(user, "_rdbtasks_queue_access", None)
    if cached is not None:
        return cached
    access = _compute(user)
    try:
        user._rdbtasks_queue_access = access
    except AttributeError:  # an object that takes no attributes: compute each time
        pass
    return access


def _compute(user: Any) -> QueueAccess:
    rules = queue_permissions()
    if not rules or getattr(user, "is_superuser", False):
        return UNRESTRICTED
    if not getattr(user, "is_authenticated", False):
        return QueueAccess(allowed=frozenset())
    member_of = set(user.groups.values_list("name", flat=True))
    listed = {queue: groups for queue, groups in rules.items() if queue != OTHER_QUEUES}
    mine = frozenset(queue for queue, groups in listed.items() if groups & member_of)
    others = rules.get(OTHER_QUEUES)
    if others is not None and not others & member_of:
        return QueueAccess(allowed=mine)
    return QueueAccess(denied=frozenset(listed) - mine)


def job_queue(queue_name: str, task_path: str) -> str:
    """The queue a job enqueues into: its own, or its task's."""
    if queue_name:
        return queue_name
    try:
        return str(getattr(load_task(task_path), "queue_name", FALLBACK_QUEUE))
    except InvalidTaskPath:
        return FALLBACK_QUEUE


def filter_jobs(queryset: _QS, access: QueueAccess) -> _QS:
    """The jobs of ``queryset`` whose queue ``access`` permits (jobs are few: done in Python)."""
    if access.unrestricted:
        return queryset
    rows = queryset.order_by().values_list("pk", "queue_name", "task_path")
    visible = [pk for pk, queue, path in rows if access.permits(job_queue(queue, path))]
    return queryset.filter(pk__in=visible)
