"""Task arguments as JSON text: normalised as the framework does, refused if they would not survive.

Every enqueue pays for this, so it is one walk over the values (plain lists,
dicts and scalars take the short way) and one C encode per column, rather
than the framework's ``normalize_json`` followed by an encode, a decode and a
comparison: the only values that encode but decode differently are dict keys
that are not strings (``{1: ...}`` comes back as ``{"1": ...}``), refused on
the walk, and non-finite floats, which the encoder refuses.

Arguments some supported database would refuse (a NUL character, a lone
surrogate, more than ``OPTIONS["MAX_ARGUMENTS_BYTES"]``) are refused too, on
every database alike (``storable.py``): a search of the JSON text says when
to look closer, so that arguments without them cost nothing more.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .exceptions import ArgumentsNotJSON
from .storable import DEFAULT_MAX_ARGUMENTS_BYTES, may_hold_unstorable, problem_in, size_problem

#: ``json.dumps(value, allow_nan=False)`` without building an encoder per call.
_encode = json.JSONEncoder(allow_nan=False).encode
_SCALARS = frozenset({str, int, float, bool, type(None)})


def encode_arguments(
    args: Sequence[Any], kwargs: Mapping[str, Any], limit: int = DEFAULT_MAX_ARGUMENTS_BYTES
) -> tuple[str, str, list[Any], dict[str, Any]]:
    """Arguments as JSON text that decodes to equal values, and those values.

    Tuples become lists as in the framework; anything that would come back
    different (a date, a set, an int dict key, NaN) is refused here, at enqueue,
    with ``ArgumentsNotJSON``, rather than surprising the task later; so is
    what a database would refuse to store, and more than ``limit`` bytes of
    JSON, both columns together.
    """
    try:
        values = [_normalized(value) for value in args]
        keywords = _normalized(kwargs)
        args_json = _encode(values) if values else "[]"
        kwargs_json = _encode(keywords) if keywords else "{}"
    except (TypeError, ValueError, RecursionError) as exc:
        try:
            culprit = _culprit(args, kwargs)
        except RecursionError:  # nested too deep to walk again
            culprit = None
        raise ArgumentsNotJSON(
            "Task arguments must be JSON-serializable: "
            f"{culprit or 'one is not'} ({str(exc).rstrip('.')})."
        ) from exc
    if (
        len(args_json) + len(kwargs_json) > limit
        or may_hold_unstorable(args_json)
        or may_hold_unstorable(kwargs_json)
    ):
        problem = _storage_problem(values, keywords, len(args_json) + len(kwargs_json), limit)
        if problem:
            raise ArgumentsNotJSON(f"Task arguments must be storable in every database: {problem}.")
    return args_json, kwargs_json, values, keywords


def encode_arguments_and_values(
    args: Sequence[Any], kwargs: Mapping[str, Any], limit: int = DEFAULT_MAX_ARGUMENTS_BYTES
) -> tuple[str, str, tuple[list[Any], dict[str, Any]]]:
    """``encode_arguments``, the values as one ``(args, kwargs)`` pair."""
    args_json, kwargs_json, values, keywords = encode_arguments(args, kwargs, limit)
    return args_json, kwargs_json, (values, keywords)


def _storage_problem(
    values: list[Any], keywords: dict[str, Any], size: int, limit: int
) -> str | None:
    """What a database would refuse of these (encoded) arguments, naming the argument."""
    named = [(f"args[{i}]", value) for i, value in enumerate(values)]
    named += [(f"kwargs[{name!r}]", value) for name, value in keywords.items()]
    for where, value in named:
        problem = problem_in(value, where)
        if problem:
            return problem
    too_big = size_problem(size, limit, "arguments")
    if too_big is None:
        return None
    where, value = max(named, key=lambda pair: len(_encode(pair[1])))
    return f"they are {too_big}; the largest, {where}, is {len(_encode(value)):,} bytes"


def _culprit(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """Which argument was refused and what it is: ``kwargs['when'] is a datetime.datetime``.

    Only on the way to an error, so the walk above stays as short as it is.
    """
    for index, value in enumerate(args):
        found = _find(value, f"args[{index}]", {})
        if found:
            return found
    for name, value in kwargs.items():
        found = _find(value, f"kwargs[{name!r}]", {})
        if found:
            return found
    return None


def _find(value: Any, where: str, outer: dict[int, str]) -> str | None:
    """The first value under ``value`` that ``_normalized`` or the encoder refuses.

    ``outer`` maps the containers around ``value`` to where they are, to name a
    value that contains itself rather than recurse without end.
    """
    if type(value) in _SCALARS or isinstance(value, str | int | float | bool):
        if isinstance(value, float) and not math.isfinite(value):
            return f"{where} is {value!r}"
        return None
    if id(value) in outer:
        return f"{outer[id(value)]} contains itself at {where}"
    outer = {**outer, id(value): where}
    if isinstance(value, Mapping):
        for key, item in value.items():
            try:
                text_key = isinstance(_normalized(key), str)
            except (TypeError, ValueError, RecursionError):
                text_key = False
            if not text_key:
                return f"{where} has a key {key!r} of type {_type_name(key)}"
            found = _find(item, f"{where}[{key!r}]", outer)
            if found:
                return found
        return None
    if isinstance(value, bytes):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return f"{where} is bytes that are not UTF-8"
        return None
    if isinstance(value, Sequence):
        for index, item in enumerate(value):
            found = _find(item, f"{where}[{index}]", outer)
            if found:
                return found
        return None
    name = _type_name(value)
    return f"{where} is {'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"


def _type_name(value: Any) -> str:
    kind = type(value)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


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
