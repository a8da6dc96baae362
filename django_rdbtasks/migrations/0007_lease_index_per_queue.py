"""The lease index leads with the queue, as the READY index does.

The claim reads each queue's expired leases as a range of its own
(``queue_name = %s AND lease_expires_at <= now ORDER BY lease_expires_at``), so
the expired leases of a queue nobody serves, or the dead index entries of
another queue's finished tasks, are never walked through by a claim of this
one. The index holds RUNNING rows only (a leading ``status`` column on MySQL
and MariaDB), so it is rebuilt from a few rows' worth of entries; PostgreSQL
still reads the table once to build it, with writes to it held meanwhile.
"""

from django.db import migrations, models

import django_rdbtasks.models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rdbtasks", "0006_task_path_btree"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="task",
            name="rdbtasks_task_lease",
        ),
        migrations.AddIndex(
            model_name="task",
            index=django_rdbtasks.models.StatusIndex(
                condition=models.Q(("status", "RUNNING")),
                fields=["queue_name", "lease_expires_at"],
                name="rdbtasks_task_lease",
            ),
        ),
    ]
