"""The pytest plugin of ``django_rdbtasks.testing``, registered by the package's ``pytest11``
entry point: the ``rdbtasks`` fixture, a ``Harness`` on the default task backend.

It asks pytest-django for the database (``db``, unless the test asked for
``transactional_db``); nothing to configure beyond ``INSTALLED_APPS``.
Without pytest-django installed the fixture is not offered.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def rdbtasks(request: Any) -> Iterator[Any]:
    """Drain tasks in-process, move the database clock, assert what was enqueued."""
    if "transactional_db" not in request.fixturenames:
        request.getfixturevalue("db")
    from .testing.harness import Harness

    harness = Harness()
    try:
        yield harness
    finally:
        harness.close()
