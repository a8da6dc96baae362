from django.db import models

from django_rdbtasks.record_processing import CheckoutManager, CheckoutMixin


class Invoice(models.Model):
    customer = models.EmailField()
    amount_cents = models.PositiveIntegerField()
    sent_at = models.DateTimeField(null=True, blank=True)
    #: The card payment of the checkout workflow (shop.tasks.checkout), and its refund.
    payment = models.CharField(max_length=50, blank=True, default="")
    refunded = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"Invoice {self.pk} for {self.customer}"


class Device(CheckoutMixin):
    """A device polled every 15 minutes by whichever app server gets to it first."""

    serial = models.CharField(max_length=50, unique=True)
    last_reading = models.FloatField(null=True, blank=True)
    polled_at = models.DateTimeField(null=True, blank=True)

    objects = CheckoutManager()

    def __str__(self) -> str:
        return self.serial
