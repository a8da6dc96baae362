"""A record processor, imported by the workers only when a test asks for it."""

import os
import time
from datetime import timedelta

from django.db import connection

from django_rdbtasks.jobs import database_now
from django_rdbtasks.record_processing import record_processor

from .models import Device, DeviceVisit

EVERY = timedelta(seconds=float(os.environ.get("RDBTASKS_TEST_PROCESS_EVERY", "2")))


@record_processor(Device, every=EVERY, batch=20, lease=1.0)
def visit(device):
    started = database_now(connection.alias)
    time.sleep(float(os.environ.get("RDBTASKS_TEST_PROCESS_SECONDS", "0.001")))
    DeviceVisit.objects.create(
        device=device,
        pid=os.getpid(),
        holder=device.checked_out_by,
        started_at=started,
        finished_at=database_now(connection.alias),
    )
