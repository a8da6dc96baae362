"""Task arguments as JSON text: normalised as the framework does, refused if they would not survive.

Every enqueue pays for this, so it is one walk over the values (plain lists,
dicts and scalars take the short way) and one C encode per column, rather
than the framework's ``normalize_json`` followed by an encode, a decode and a
comparison: the only values that encode but decode differently are dict keys
that are not strings (``{1: ...}`` comes back as ``{"1": ...}``), refused on
the walk, and non-finite floats, which the encoder refuses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .exceptions import ArgumentsNotJSON

#: ``json.dumps(value, allow_nan=False)`` without building an encoder per call.
_encode = json.JSONEncoder(allow_nan=False).encode
_SCALARS = frozenset({str, int, float, bool, type(None)})


def encode_arguments_and_values(
    args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[str, str, tuple[list[Any], dict[str, Any]]]:
    """Arguments as JSON text that decodes to equal values, and those values.

    Tuples become lists as in the framework; anything that would come back
    different (a date, a set, an int dict key, NaN) is refused here, at enqueue,
    with ``ArgumentsNotJSON``, rather than surprising the task later.
    """
    try:
        values = [_normalized(value) for value in args]
        keywords = _normalized(kwargs)
        args_json = _encode(values) if values else "[]"
        kwargs_json = _encode(keywords) if keywords else "{}"
    except (TypeError, ValueError, RecursionError) as exc:
        raise ArgumentsNotJSON(f"Task arguments must be JSON-serializable: {exc}") from exc
    return args_json, kwargs_json, (values, keywords)


def _normalized(value: Any) -> Any:
    """``normalize_json(value)`` (the framework's), refusing keys JSON would turn into text."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list or kind is tuple:
        return [_normalized(item) for item in value]
    if kind is dict or isinstance(value, Mapping):
        normalized = {}
        for key, item in value.items():
            key = _normalized(key)
            if not isinstance(key, str):
                raise TypeError(
                    f"dict keys must be strings, not {type(key).__name__} ({key!r}): "
                    "JSON would turn them into text."
                )
            normalized[key] = _normalized(item)
        return normalized
    # The framework's order for everything else: bytes as UTF-8 text, then
    # subclasses of the scalars, then any other sequence as a list.
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"Unsupported value: {kind}") from exc
    if isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Sequence):
        return [_normalized(item) for item in value]
    raise TypeError(f"Unsupported type: {kind}")
