from django.db import models


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
