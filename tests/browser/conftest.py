"""Real-browser tests: Debian's Chromium driven by Playwright, against the live server.

Chromium is never downloaded (no ``playwright install``): the tests launch the
system's ``/usr/bin/chromium`` (``apt-get install chromium``) or the one named
by ``RDBTASKS_CHROMIUM``. Without it the tests are skipped on a developer's
machine and fail under ``CI=true``, so CI can never pass without running them.
Screenshots go to ``artifacts/screenshots/``; with ``RDBTASKS_UPDATE_SCREENSHOTS=1``
the ones the docs show are copied to ``docs/screenshots/`` as well.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "screenshots"
DOCS = ROOT / "docs" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: drives a real Chromium (tests/browser)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"{reason} (CI must run the browser tests)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium per module; Playwright's event loop lives only as long as it."""
    executable = os.environ.get("RDBTASKS_CHROMIUM") or shutil.which("chromium") or ""
    if not executable or not os.access(executable, os.X_OK):
        _missing("no Chromium: apt-get install chromium (or set RDBTASKS_CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright is not installed: pip install -e '.[test]'")
    # Playwright's synchronous API keeps an asyncio loop registered in this
    # thread, and Django refuses ORM calls from a thread with a running loop.
    # The tests use the ORM between browser steps, never concurrently with it.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            instance = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
            try:
                yield instance
            finally:
                instance.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1600, "height": 900}, locale="en-US")
    context.set_default_timeout(15_000)
    tab = context.new_page()
    try:
        yield tab
    finally:
        context.close()


@pytest.fixture
def screenshot(page: Any):
    """``screenshot(name, docs=False)``: save the page; ``docs`` ones may go to docs/."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def take(name: str, *, docs: bool = False, full_page: bool = True) -> Path:
        path = ARTIFACTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        if docs and os.environ.get("RDBTASKS_UPDATE_SCREENSHOTS"):
            DOCS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, DOCS / path.name)
        return path

    return take
