"""An outcome as every database stores it: made so before the round, failed if refused anyway.

The worker checks a task's data where it is made (a result in
``worker/execution.py``, a traceback in its history entry), by the rule of
``storable.py``. ``make_storable`` applies the same rule to a whole outcome
as it is encoded for the round (``Dialect.encode_outcome``), so that nothing
a database would refuse reaches one, whatever made it: every text of the
history entry kept readable and bounded, a result that cannot be stored
turned into the task's failure.

A database may still refuse an outcome (a server whose ``max_allowed_packet``
is below the limits, a column or constraint of a schema changed by hand).
``fail_refused`` turns such an outcome into the task's FAILED outcome, with
an error saying what was refused and why: the claim store
(``worker/store.py``) writes it in place of the refused one, and the task is
neither retried nor run again.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from ..database_errors import describe
from ..exceptions import ValueNotStorable, error_path, error_summary
from ..states import AttemptOutcome, OutcomeKind
from ..storable import (
    DEFAULT_MAX_ERROR_BYTES,
    StorageLimits,
    json_problem,
    readable_text,
)
from .rows import Outcome

#: The most bytes of a database's own message quoted in a refusal's error.
REFUSAL_EXCERPT_BYTES = 1000
#: What a failure's history entry keeps of the entry it replaces: the attempt.
_ATTEMPT_FIELDS = ("attempt", "worker_id", "started_at", "finished_at")


def make_storable(outcome: Outcome, limits: StorageLimits) -> None:
    """Make ``outcome`` what every database stores, in place (see the module)."""
    if outcome.return_value is not None:
        text = outcome.return_json()
        assert text is not None
        problem = json_problem(outcome.return_value, text, "the result", limits.result, "result")
        if problem:
            _fail(outcome, ValueNotStorable(f"{problem}."), outcome.entry, limits.error)
    if outcome.entry is not None:
        outcome.entry = _readable(outcome.entry, limits.error)


def _readable(value: Any, limit: int) -> Any:
    """Every text under a history entry readable and at most ``limit`` bytes."""
    if isinstance(value, str):
        return readable_text(value, limit)
    if isinstance(value, dict):
        return {readable_text(str(k), limit): _readable(v, limit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_readable(item, limit) for item in value]
    return value


def fail_refused(
    outcome: Outcome, refusal: BaseException, worker_id: str, detail: str = ""
) -> Outcome:
    """Turn ``outcome``, which a database refused, into the task's failure, in place.

    Returns a copy of the outcome as it was, to put back (``restore``) if the
    failure is refused too: then the refusal was not of this task's data.
    ``detail``: what the database says of the limit it hit, if anything.
    """
    before = dataclasses.replace(outcome)
    excerpt = readable_text(describe(refusal), REFUSAL_EXCERPT_BYTES, "message")
    error = ValueNotStorable(
        f"the database refused to store this task's {_what(outcome)}: {excerpt}"
        f"{f' ({detail})' if detail else ''}. The task is failed rather than retried: "
        "the same write would be refused again."
    )
    _fail(outcome, error, outcome.entry, DEFAULT_MAX_ERROR_BYTES, worker_id)
    return before


def restore(outcome: Outcome, before: Outcome) -> None:
    """Put back what ``fail_refused`` changed."""
    for field in dataclasses.fields(Outcome):
        setattr(outcome, field.name, getattr(before, field.name))


def _what(outcome: Outcome) -> str:
    if outcome.kind == OutcomeKind.SUCCESS:
        return "result"
    if outcome.entry is not None and "exception_class_path" in outcome.entry:
        return f"outcome ({outcome.kind.value}, {outcome.entry['exception_class_path']})"
    return f"outcome ({outcome.kind.value})"


def _fail(
    outcome: Outcome,
    error: ValueNotStorable,
    entry: dict[str, Any] | None,
    limit: int,
    worker_id: str = "",
) -> None:
    """``outcome`` becomes a FAILURE with ``error``, its history entry made for it."""
    row = outcome.row
    base: dict[str, Any] = {}
    if entry is not None:
        base = {key: entry[key] for key in _ATTEMPT_FIELDS if key in entry}
    elif row is not None:
        base = {
            "attempt": row.attempts,
            "worker_id": worker_id,
            "started_at": row.claimed_at.isoformat(),
            "finished_at": (row.claimed_at + timedelta(seconds=outcome.duration)).isoformat(),
        }
    outcome.kind = OutcomeKind.FAILURE
    outcome.return_value = None
    outcome.delay = 0.0
    outcome.error = error
    outcome.entry = {
        **base,
        "outcome": AttemptOutcome.FAILED,
        "exception_class_path": error_path(error),
        "traceback": readable_text(error_summary(error), limit, "error"),
    }
    outcome.wire = None
    outcome.texts = None
