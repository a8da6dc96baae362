"""The trace context a task was enqueued in (OpenTelemetry, optional).

Nullable with no default: adding it rewrites no row, and workers of the
previous release, which do not read it, keep running during a rolling deploy.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rdbtasks", "0003_task_search_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="trace_context",
            field=models.JSONField(blank=True, editable=False, null=True),
        ),
    ]
