"""The operators' admin: what is stuck, what failed and why, and fixing it without a shell.

Laid out as ``django.contrib.admin`` is: one module per ModelAdmin, and the
filters, the changelist, the actions and the display helpers they share.
"""

from django.contrib import admin

from ..models import Dashboard, Job, JobRecord, LimitSlot, Task, Worker, Workflow
from .dashboard import Chart, DashboardAdmin
from .display import cron_in_words, redact
from .jobs import JobAdmin
from .limits import LimitSlotAdmin
from .records import JobRecordAdmin
from .tasks import TaskAdmin
from .workers import WorkerAdmin
from .workflows import WorkflowAdmin

admin.site.register(Task, TaskAdmin)
admin.site.register(Dashboard, DashboardAdmin)
admin.site.register(Job, JobAdmin)
admin.site.register(JobRecord, JobRecordAdmin)
admin.site.register(Worker, WorkerAdmin)
admin.site.register(Workflow, WorkflowAdmin)
admin.site.register(LimitSlot, LimitSlotAdmin)

__all__ = [
    "Chart",
    "DashboardAdmin",
    "JobAdmin",
    "JobRecordAdmin",
    "LimitSlotAdmin",
    "TaskAdmin",
    "WorkerAdmin",
    "WorkflowAdmin",
    "cron_in_words",
    "redact",
]
