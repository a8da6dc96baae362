"""What each outcome kind writes to its task's row: the table every dialect renders."""

from __future__ import annotations

from ..states import OutcomeKind

#: What each outcome kind writes, besides its new status (``OutcomeKind.status``)
#: and, for every kind but NOTE, ``version + 1`` and ``lease_expires_at = NULL``.
#: The values are templates each dialect renders: ``{now}`` its clock,
#: ``{delayed}`` the clock plus the outcome's delay, ``{history}`` the history
#: with the outcome's entry appended, ``{return_value}`` the JSON result,
#: ``{attempt_back}`` the attempt count less the one the claim added.
OUTCOME_WRITES: dict[OutcomeKind, dict[str, str]] = {
    OutcomeKind.SUCCESS: {
        "return_value": "{return_value}",
        "finished_at": "{now}",
        "history": "{history}",
    },
    OutcomeKind.FAILURE: {"finished_at": "{now}", "history": "{history}"},
    OutcomeKind.RETRY: {"worker_id": "''", "run_after": "{delayed}", "history": "{history}"},
    OutcomeKind.RELEASE: {"worker_id": "''", "attempts": "{attempt_back}"},
    OutcomeKind.POSTPONE: {
        "worker_id": "''",
        "attempts": "{attempt_back}",
        "run_after": "{delayed}",
    },
    OutcomeKind.HANDOVER: {
        "worker_id": "''",
        "attempts": "{attempt_back}",
        "run_after": "{delayed}",
        "history": "{history}",
    },
    OutcomeKind.ABANDON: {
        "attempts": "{attempt_back}",
        "finished_at": "{now}",
        "history": "{history}",
    },
    OutcomeKind.CANCELLED: {"finished_at": "{now}", "history": "{history}"},
    OutcomeKind.NOTE: {"history": "{history}"},
}
#: Kinds after which the task's dependants must be released or ended, in the
#: same transaction.
SETTLES_DEPENDANTS = frozenset(
    {OutcomeKind.SUCCESS, OutcomeKind.FAILURE, OutcomeKind.ABANDON, OutcomeKind.CANCELLED}
)
