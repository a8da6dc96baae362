from django.apps import AppConfig


class RDBTasksConfig(AppConfig):
    name = "django_rdbtasks"
    verbose_name = "Task queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the checks
