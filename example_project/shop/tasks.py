import random
import time

from django.utils import timezone

from django_rdbtasks.compat import HAS_DJANGO_TASKS

from .models import Invoice

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
