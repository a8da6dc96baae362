from typing import ClassVar

from django.db import models

from django_rdbtasks.record_processing import CheckoutManager, CheckoutMixin


class SideEffect(models.Model):
    """One row per task body run: what concurrency tests count."""

    key = models.CharField(max_length=100, db_index=True)
    pid = models.IntegerField(default=0)
    worker_id = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.key} by {self.pid}"


class Invoice(models.Model):
    number = models.CharField(max_length=50)

    def __str__(self) -> str:
        return self.number


class Device(CheckoutMixin):
    """Records checked out and processed on a schedule by the workers."""

    name = models.CharField(max_length=50)

    objects: ClassVar[CheckoutManager] = CheckoutManager()

    def __str__(self) -> str:
        return self.name


class DeviceVisit(models.Model):
    """One processing of a device: who, and from when to when (database clock)."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE)
    pid = models.IntegerField()
    holder = models.CharField(max_length=200)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.device_id} by {self.holder}"


class LimitedRun(models.Model):
    """One run of a limited task: its key and when it ran (database clock)."""

    key = models.CharField(max_length=100)
    pid = models.IntegerField(default=0)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"{self.key} by {self.pid}"
