import random
import time
from datetime import timedelta

from django.utils import timezone

from django_rdbtasks.compat import HAS_DJANGO_TASKS
from django_rdbtasks.dependencies import Workflow
from django_rdbtasks.jobs import periodic
from django_rdbtasks.record_processing import record_processor

from .models import Device, Invoice

if HAS_DJANGO_TASKS:
    from django.tasks import task
else:
    from django_tasks import task


@task(queue_name="emails", max_attempts=5, backoff=1.0)
def send_invoice(invoice_id: int) -> str:
    invoice = Invoice.objects.get(pk=invoice_id)
    time.sleep(random.uniform(0.01, 0.2))  # the mail server
    if random.random() < 0.1:
        raise ConnectionError("mail server did not answer")  # retried with backoff
    invoice.sent_at = timezone.now()
    invoice.save(update_fields=["sent_at"])
    return invoice.customer


@task()
def nightly_total() -> int:
    return sum(Invoice.objects.values_list("amount_cents", flat=True))


@record_processor(Device, every=timedelta(minutes=15), batch=20, lease=60)
def poll_device(device: Device) -> None:
    """Runs in every worker process; each device once per 15 minutes, never twice at once."""
    time.sleep(random.uniform(0.001, 0.01))  # the device's API
    device.last_reading = random.uniform(15.0, 25.0)
    device.polled_at = timezone.now()
    device.save(update_fields=["last_reading", "polled_at"])


@periodic("0 3 * * *", timezone="Europe/Berlin")
@task()
def nightly_report() -> int:
    """A cron Job declared in code: fires once a night across all hosts."""
    return Invoice.objects.filter(sent_at__isnull=False).count()


@task(max_attempts=3, backoff=1.0)
def charge_card(invoice_id: int) -> dict:
    invoice = Invoice.objects.get(pk=invoice_id)
    invoice.payment = f"pay-{invoice_id}"  # the payment provider's id
    invoice.save(update_fields=["payment"])
    return {"payment": invoice.payment}


@task(max_attempts=5, backoff=1.0)
def refund_card(invoice_id: int, *, step_result: dict) -> None:
    """Undoes charge_card when a later step of the checkout fails for good."""
    Invoice.objects.filter(pk=invoice_id, payment=step_result["payment"]).update(refunded=True)


def checkout(invoice_id: int) -> dict:
    """Charge the card, then send the invoice; refund the card if the invoice cannot be sent."""
    flow = Workflow(name=f"checkout {invoice_id}")
    flow.add("charge", charge_card, invoice_id, compensate_with=refund_card)
    flow.add("send", send_invoice, invoice_id, depends_on=["charge"])
    return flow.enqueue()
