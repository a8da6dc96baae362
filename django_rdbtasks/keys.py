"""Keys computed from a task's arguments: dedup keys, ``once()`` keys, limit keys."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .compat import InvalidTask


def task_key(
    template: str | Callable[..., Any],
    task: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    what: str = "Key",
) -> str:
    """A key computed from a task's arguments, by format string or callable."""
    if callable(template):
        return str(template(*args, **kwargs))
    parameters = list(inspect.signature(task.func).parameters)
    if task.takes_context:
        parameters = parameters[1:]
    bound = dict(zip(parameters, args, strict=False))
    bound.update(kwargs)
    try:
        return template.format(**bound)
    except (KeyError, IndexError) as exc:
        raise InvalidTask(f"{what} {template!r} names {exc}, which is not an argument.") from exc
