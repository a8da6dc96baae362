"""A django-maintenance-tasks backfill: found by the library's autodiscovery of this module."""

from maintenance_tasks.task import MaintenanceTask

from tests.testapp.models import SideEffect

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf"]


class Backfill(MaintenanceTask):
    description = "One SideEffect per word, three words a batch."
    batch_size = 3

    def collection(self) -> list[str]:
        return WORDS

    def process(self, item: str) -> None:
        SideEffect.objects.create(key=f"backfill-{item}")
