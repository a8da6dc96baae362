"""Wagtail on this backend, as a new user sets it up: an editor creates and publishes pages.

Each save enqueues Wagtail's tasks in the save's transaction: the search index
update of the ``modelsearch`` library (``modelsearch.tasks``; the
``modelsearch`` distribution Wagtail requires is no installed app, and before
issue 44 ``enqueue()`` refused the task in the middle of the editor's save) and
the reference index update (``wagtail.tasks``). The search finds a page only
once the worker has run the first: proof that the library's task ran, not only
that it was queued.
"""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from wagtail.models import Page

from django_rdbtasks.models import Task
from django_rdbtasks.worker import Worker
from tests.libraries.pages.models import ArticlePage

# Real commits (the worker process reads them). The flush after each test would
# take the root pages and locale Wagtail's migrations made: they are put back.
# Every test of tests/libraries/ does so: after a flush without it, Django
# makes the content types anew, and putting them back fails on their names.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

SEARCH_TASK = "modelsearch.tasks.insert_or_update_object_task"
REFERENCE_TASK = "wagtail.tasks.update_reference_index_task"


@pytest.fixture
def editor() -> Client:
    get_user_model().objects.create_superuser("editor", "editor@example.com", "secret")
    client = Client()
    assert client.login(username="editor", password="secret")
    return client


def found(words: str) -> list[str]:
    return [page.title for page in ArticlePage.objects.live().search(words)]


def statuses() -> set[str]:
    return set(Task.objects.values_list("status", flat=True))


def run_worker() -> None:
    Worker(burst=True).run(install_signals=False)
    assert statuses() == {"SUCCESSFUL"}, list(Task.objects.values_list("task_path", "history"))


def create(editor: Client, title: str, body: str, *, publish: bool) -> ArticlePage:
    home = Page.objects.get(depth=2)  # the site's home page, from Wagtail's migrations
    form = {"title": title, "slug": "autumn", "body": body}
    if publish:
        form["action-publish"] = "action-publish"
    response = editor.post(f"/cms/pages/add/pages/articlepage/{home.pk}/", form)
    assert response.status_code == 302, response.content.decode()[:2000]  # saved, not a 500
    return ArticlePage.objects.get(slug="autumn")


def test_an_editor_creates_and_publishes_a_page_which_the_search_finds(editor):
    create(editor, "Autumn leaves", "Maple and oak turn red.", publish=True)
    paths = set(Task.objects.values_list("task_path", flat=True))
    assert {SEARCH_TASK, REFERENCE_TASK} <= paths
    assert found("maple") == []  # indexed by the task, not by the save
    run_worker()
    assert found("maple") == ["Autumn leaves"]


def test_an_editor_publishes_a_draft_with_changes(editor):
    page = create(editor, "Autumn leaves", "Maple and oak turn red.", publish=False)
    run_worker()
    assert found("maple") == []  # a draft is not live
    response = editor.post(
        f"/cms/pages/{page.pk}/edit/",
        {
            "title": "Winter frost",
            "slug": "autumn",
            "body": "Birch and pine stand white.",
            "action-publish": "action-publish",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert found("birch") == []
    run_worker()
    assert found("birch") == ["Winter frost"] and found("maple") == []


def test_the_system_checks_pass_with_wagtails_tasks_declared():
    """E012 (a task no worker would load) has nothing to say of Wagtail's tasks."""
    from modelsearch import tasks  # noqa: F401  (declared at start-up anyway)

    call_command("check")


@pytest.mark.slow
def test_a_worker_process_runs_wagtails_tasks(editor, run_workers):
    create(editor, "Autumn leaves", "Maple and oak turn red.", publish=True)
    workers = run_workers("--burst", env={"DJANGO_SETTINGS_MODULE": "tests.settings_libraries"})
    assert workers.wait(timeout=120) == 0, workers.log()
    assert found("maple") == ["Autumn leaves"]
    assert statuses() == {"SUCCESSFUL"}, workers.log()
