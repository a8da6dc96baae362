from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_rdbtasks", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="requested_run_after",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="last_declared_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="retired_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
    ]
