from django.db import models


class Invoice(models.Model):
    customer = models.EmailField()
    amount_cents = models.PositiveIntegerField()
    sent_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"Invoice {self.pk} for {self.customer}"
