"""Wagtail on this backend, as a new user sets it up: pages saved, published and found.

A page save enqueues Wagtail's tasks in the save's transaction: the search
index update of the ``modelsearch`` library (``modelsearch.tasks``, which is
not an installed app: refused at enqueue before issue 44) and the reference
index update (``wagtail.tasks``). The search finds a page only once the worker
ran the first: proof that the library's task ran, not only that it was queued.
"""

import pytest
from django.core.management import call_command
from django.db import transaction
from wagtail.models import Page

from django_rdbtasks.models import Task
from django_rdbtasks.worker import Worker

# Real commits (the worker process reads them). The flush after each test would
# take the root page and locale Wagtail's migrations made: they are put back.
# Every test of tests/libraries/ does so: after a flush without it, Django
# makes the content types anew, and putting them back fails on their names.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

SEARCH_TASK = "modelsearch.tasks.insert_or_update_object_task"
REFERENCE_TASK = "wagtail.tasks.update_reference_index_task"


def found(words: str) -> list[str]:
    return [page.title for page in Page.objects.live().search(words)]


def new_page(title: str) -> Page:
    with transaction.atomic():  # as a view saves: the tasks are enqueued in its transaction
        page = Page.get_first_root_node().add_child(instance=Page(title=title, slug="autumn"))
    return page


def enqueued_paths() -> list[str]:
    return sorted(Task.objects.values_list("task_path", flat=True))


def test_creating_a_page_enqueues_wagtails_tasks_which_a_worker_runs():
    page = new_page("Autumn leaves")
    assert SEARCH_TASK in enqueued_paths() and REFERENCE_TASK in enqueued_paths()
    assert found("autumn") == []  # indexed by the task, not by the save
    Worker(burst=True).run(install_signals=False)
    assert found("autumn") == ["Autumn leaves"]
    statuses = set(Task.objects.values_list("status", flat=True))
    assert statuses == {"SUCCESSFUL"}, list(Task.objects.values_list("task_path", "history"))
    assert page.pk


def test_publishing_a_revision_updates_the_index_through_the_worker():
    page = new_page("Autumn leaves")
    Worker(burst=True).run(install_signals=False)
    page.title = "Winter frost"
    with transaction.atomic():
        page.save_revision().publish()
    assert found("winter") == []
    Worker(burst=True).run(install_signals=False)
    assert found("winter") == ["Winter frost"] and found("autumn") == []
    assert set(Task.objects.values_list("status", flat=True)) == {"SUCCESSFUL"}


def test_the_system_checks_pass_with_wagtails_tasks_declared():
    """E012 (a task no worker would load) has nothing to say of Wagtail's tasks."""
    from modelsearch import tasks  # noqa: F401  (declared at start-up anyway)

    call_command("check")


@pytest.mark.slow
def test_a_worker_process_runs_wagtails_tasks(run_workers):
    new_page("Autumn leaves")
    workers = run_workers("--burst", env={"DJANGO_SETTINGS_MODULE": "tests.settings_libraries"})
    assert workers.wait(timeout=120) == 0, workers.log()
    assert found("autumn") == ["Autumn leaves"]
    assert set(Task.objects.values_list("status", flat=True)) == {"SUCCESSFUL"}, workers.log()
