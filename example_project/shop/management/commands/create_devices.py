from django.core.management.base import BaseCommand

from shop.models import Device


class Command(BaseCommand):
    help = "Create devices for the poll_device record processor (due at once)."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=1000)

    def handle(self, *args, count, **options):
        existing = set(Device.objects.values_list("serial", flat=True))
        new = [
            Device(serial=f"dev-{n:05d}") for n in range(count) if f"dev-{n:05d}" not in existing
        ]
        Device.objects.bulk_create(new)
        self.stdout.write(f"{len(new)} devices created, {Device.objects.count()} in all")
