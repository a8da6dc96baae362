import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    # Any migration after wagtailcore made its Page table will do: an older one
    # than the newest keeps this valid across Wagtail 8.x releases.
    dependencies = [("wagtailcore", "0094_alter_page_locale")]

    operations = [
        migrations.CreateModel(
            name="ArticlePage",
            fields=[
                (
                    "page_ptr",
                    models.OneToOneField(
                        auto_created=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        parent_link=True,
                        primary_key=True,
                        serialize=False,
                        to="wagtailcore.page",
                    ),
                ),
                ("body", models.TextField(blank=True)),
            ],
            options={"abstract": False},
            bases=("wagtailcore.page",),
        ),
    ]
