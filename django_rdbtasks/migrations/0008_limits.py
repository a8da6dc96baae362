"""Cluster-wide concurrency and rate limits (``limits.py``).

Three nullable columns on the task (nothing is rewritten) and the slot table
the claim takes a slot of.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rdbtasks", "0007_lease_index_per_queue"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="limit_count",
            field=models.PositiveIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="limit_key",
            field=models.CharField(blank=True, editable=False, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="limit_period",
            field=models.FloatField(blank=True, editable=False, null=True),
        ),
        migrations.CreateModel(
            name="LimitSlot",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.CharField(max_length=200)),
                ("slot_no", models.PositiveIntegerField()),
                ("period", models.FloatField(default=0)),
                ("free_at", models.DateTimeField(blank=True, null=True)),
                ("last_started_at", models.DateTimeField(blank=True, null=True)),
                ("holder_id", models.UUIDField(blank=True, null=True)),
                ("holder_version", models.PositiveBigIntegerField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "limit slot",
                "verbose_name_plural": "limits",
                "indexes": [models.Index(fields=["holder_id"], name="rdbtasks_limit_holder")],
                "constraints": [
                    models.UniqueConstraint(fields=("key", "slot_no"), name="rdbtasks_limit_slot")
                ],
            },
        ),
    ]
