"""The dedup key's unique constraint without entries for rows that have no key.

``active_dedup_key`` is NULL for every task without a dedup key and for every
finished task, yet each claim and each outcome (an UPDATE that cannot be HOT)
added an entry for its NULL to this unique index. On PostgreSQL (and SQLite)
it is now partial, ``WHERE active_dedup_key IS NOT NULL``: a task without a
key costs this index nothing. Uniqueness is unchanged (NULLs never collided).
MySQL and MariaDB have no partial unique constraints: there the constraint is
dropped and made again as it was.

PostgreSQL builds the new index reading the whole table, with writes to it
held meanwhile (a few seconds per million rows); the drop and the build are
one transaction, so no duplicate can slip in between.
"""

from django.db import migrations

import django_rdbtasks.models.tasks


class Migration(migrations.Migration):
    dependencies = [
        ("django_rdbtasks", "0010_limit_indexes"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="task",
            name="rdbtasks_task_one_active",
        ),
        migrations.AddConstraint(
            model_name="task",
            constraint=django_rdbtasks.models.tasks.NonNullUnique(
                fields=["active_dedup_key"], name="rdbtasks_task_one_active"
            ),
        ),
    ]
