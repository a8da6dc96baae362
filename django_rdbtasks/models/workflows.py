"""Sagas: a workflow and the role of each of its tasks (sagas.py)."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..db.functions import DbNow
from ..states import StepRole, WorkflowState
from .tasks import Task, uuid7


class Workflow(models.Model):
    """A workflow enqueued with compensations (a saga), and where it stands (``sagas.py``)."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    name = models.CharField(max_length=200, blank=True, default="")
    state = models.CharField(
        max_length=24, choices=WorkflowState.choices, default=WorkflowState.RUNNING
    )
    #: Bumped whenever one of its tasks is settled: that UPDATE is the lock
    #: that makes the settlings of its tasks one after the other.
    version = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(db_default=DbNow())
    finished_at = models.DateTimeField(null=True, blank=True)
    #: The task whose failure started the compensation, or the compensation that failed.
    reason = models.TextField(blank=True, default="")

    class Meta:
        verbose_name = _("workflow")
        verbose_name_plural = _("workflows")
        # The admin's list, newest first, filtered by state.
        indexes = [models.Index(fields=["state", "id"], name="rdbtasks_workflow_state")]

    def __str__(self) -> str:
        return f"{self.name or 'workflow'} ({self.id})"


class WorkflowStep(models.Model):
    """A task of a workflow: one of its steps, or the compensation of one."""

    # No constraints in the database (see TaskDependency).
    task = models.OneToOneField(
        Task,
        primary_key=True,
        on_delete=models.CASCADE,
        related_name="workflow_step",
        db_constraint=False,
    )
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="steps")
    name = models.CharField(max_length=200)
    role = models.CharField(max_length=16, choices=StepRole.choices, default=StepRole.STEP)
    #: The task path of what undoes this step; empty: nothing to undo.
    compensate_with = models.CharField(max_length=255, blank=True, default="")
    #: For a compensation: the step it undoes.
    undoes = models.ForeignKey(
        Task,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
    )

    class Meta:
        verbose_name = _("workflow step")
        verbose_name_plural = _("workflow steps")

    def __str__(self) -> str:
        return f"{self.name} ({self.role})"
