from django.core.management.base import BaseCommand
from django.db import transaction

from shop.models import Invoice
from shop.tasks import nightly_total, send_invoice


class Command(BaseCommand):
    help = "Create invoices and enqueue their e-mails in the same transaction."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=25)

    def handle(self, *args, count, **options):
        for number in range(count):
            with transaction.atomic():
                invoice = Invoice.objects.create(
                    customer=f"customer{number}@example.com", amount_cents=100 * (number + 1)
                )
                send_invoice.enqueue(invoice.pk)
        nightly_total.enqueue()
        self.stdout.write(f"created {count} invoices and enqueued {count + 1} tasks")
