"""docs/sql/<database>.sql is the SQL the code builds: a change to a statement is a SQL diff.

When a statement changes on purpose, ``make sql`` writes the files again and
the diff goes into review with the change.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from django_rdbtasks.db.catalog import ENGINES, render, statements

DOCS = Path(__file__).resolve().parent.parent / "docs" / "sql"


@pytest.mark.parametrize("vendor", sorted(ENGINES))
def test_the_sql_files_are_what_the_code_builds(vendor):
    written = (DOCS / f"{vendor}.sql").read_text()
    built = render(vendor)
    if written != built:
        diff = "".join(
            list(
                difflib.unified_diff(
                    written.splitlines(True),
                    built.splitlines(True),
                    f"docs/sql/{vendor}.sql",
                    "as built",
                )
            )[:80]
        )
        pytest.fail(f"docs/sql/{vendor}.sql differs from the code (run make sql):\n{diff}")


@pytest.mark.parametrize("vendor", sorted(ENGINES))
def test_every_statement_has_a_name_of_its_own_and_a_comment(vendor):
    names = [s.name for s in statements(vendor)]
    assert len(names) == len(set(names))
    assert all(s.comment.strip() for s in statements(vendor))


def test_the_claim_in_every_form_and_mode_is_there():
    names = {s.name for s in statements("postgresql")}
    for form in ("lean", "window", "walk"):
        for mode in ("optimistic", "skip_locked"):
            assert f"round_claim_{form}_{mode}" in names
    portable = {s.name for s in statements("mysql")}
    assert {"claim_first_read", "claim_first_read_skip_locked_0", "claim_compare_and_set"} <= (
        portable
    )
