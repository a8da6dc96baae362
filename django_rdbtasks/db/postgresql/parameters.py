"""How a round's values go to PostgreSQL: arrays as one literal, outcomes as one JSON text."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from ..rows import Outcome

#: What an array literal of ids and versions is made of: nothing to quote.
_PLAIN_ELEMENTS = re.compile(r"[0-9a-fA-F-]+(?:,[0-9a-fA-F-]+)*")


def parameter(value: Any) -> Any:
    """A list of ids or versions as one array literal; anything else as it is.

    psycopg dumps a list element by element in Python, quoting each; a round
    sends a few arrays of a hundred ids, and one joined text costs a tenth of
    that. A list whose text would need quoting (not numbers, not UUIDs) is
    left to psycopg. Every array parameter is cast in the SQL (``::uuid[]``).
    """
    if type(value) is not list:
        return value
    text = ",".join(map(str, value))
    if not value or _PLAIN_ELEMENTS.fullmatch(text):
        return "{" + text + "}"
    return value


def array_literal(values: Sequence[Any]) -> str:
    """Any values as one array literal, each element quoted (cast in the SQL).

    Sent as text whether empty or not: psycopg prepares a statement per types
    of its parameters, and an empty list and a list of text or timestamps
    would be three statements where one is meant.
    """
    quoted = (
        '"'
        + (v.isoformat() if hasattr(v, "isoformat") else str(v))
        .replace("\\", "\\\\")
        .replace('"', '\\"')
        + '"'
        for v in values
    )
    return "{" + ",".join(quoted) + "}"


#: One encoder for every outcome: ``json.dumps`` with arguments makes a new one a call.
_ENCODER = json.JSONEncoder(default=str, separators=(",", ":"))


def _made_once() -> Callable[[Any], str]:
    """``_ENCODER.encode``, without making its C encoder again at every call.

    ``JSONEncoder.encode`` builds one (``c_make_encoder``) per call, about half
    of what encoding an outcome costs; this builds it once, with the same
    settings. Without the circular-reference check: it keeps its state in
    the encoder, which the threads share, and an outcome's return value was
    checked by ``json.dumps`` as the task returned it (``_json_value``).
    Where the C encoder is missing, or takes other arguments, ``_ENCODER.encode``.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _ENCODER.encode
    try:
        iterencode = make(
            None, str, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True
        )
        sample = {"a": [1, 2.5, None, True], "b": "\u00e9\n", "c": {"d": float("inf")}}
        if "".join(iterencode(sample, 0)) != _ENCODER.encode(sample):
            return _ENCODER.encode
    except (TypeError, ValueError):
        return _ENCODER.encode
    return lambda value: "".join(iterencode(value, 0))


_encode = _made_once()


def outcome_json(o: Outcome) -> str:
    # A JSON null becomes SQL NULL in jsonb_to_recordset: None stays "no value".
    return _encode(
        {
            "id": str(o.id),
            "version": o.version,
            "rv": o.return_value,
            "entry": o.entry,
            "delay": o.delay,
        }
    )


def outcomes_json(outcomes: Sequence[Outcome]) -> str:
    """One JSON array of the outcomes, each as encoded ahead where it was."""
    return "[" + ",".join(o.wire if o.wire is not None else outcome_json(o) for o in outcomes) + "]"
