"""The names of the app's tables that the statements read and write."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Tables:
    """As the models name them (``dialects.model_tables``), unquoted."""

    task: str
    paused_queue: str
    limit_slot: str
