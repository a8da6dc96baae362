"""Keys computed from a task's arguments: dedup keys, ``once()`` keys, limit keys."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .compat import InvalidTask
from .storable import character_problem


def task_key(
    template: str | Callable[..., Any],
    task: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    what: str = "Key",
) -> str:
    """A key computed from a task's arguments, by format string or callable.

    ``InvalidTask`` if it names no argument, or holds what no database stores
    in its column (a NUL, a lone surrogate: ``storable.py``).
    """
    if callable(template):
        key = str(template(*args, **kwargs))
    else:
        parameters = list(inspect.signature(task.func).parameters)
        if task.takes_context:
            parameters = parameters[1:]
        bound = dict(zip(parameters, args, strict=False))
        bound.update(kwargs)
        try:
            key = template.format(**bound)
        except (KeyError, IndexError) as exc:
            raise InvalidTask(
                f"{what} {template!r} names {exc}, which is not an argument."
            ) from exc
    problem = character_problem(key)
    if problem:
        raise InvalidTask(f"{what} {key!r} {problem}.")
    return key
