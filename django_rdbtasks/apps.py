from django.apps import AppConfig


class RDBTasksConfig(AppConfig):
    name = "django_rdbtasks"
    verbose_name = "Task queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # registers the checks of settings and jobs

        # The task backends' checks too: on Django 5.2 only the backport's app
        # would, and the README installs this app alone.
        checks.register_backend_checks()
