"""Prometheus gauges of the cluster-wide limits, read at scrape time (``limit_usage``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class LimitCollector:
    """Per limit key: its slots, how many are in use, how many tasks wait for it."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def describe(self) -> list[Any]:
        return []  # nothing to check at registration (that would query the database)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from .. import snapshots
        from ..limit_usage import key_usage
        from ..reads import read_database

        labels = ["key", "kind"]
        slots = GaugeMetricFamily(
            "rdbtasks_limit_slots",
            "The limit of each key with a slot in use or a task waiting: N running at "
            "once (concurrency) or N starts per period (rate).",
            labels=labels,
        )
        in_use = GaugeMetricFamily(
            "rdbtasks_limit_in_use",
            "Slots in use: tasks running now (concurrency), starts within the last period (rate).",
            labels=labels,
        )
        waiting = GaugeMetricFamily(
            "rdbtasks_limit_waiting",
            "READY tasks of the key (due or not), waiting for a slot or their time.",
            labels=labels,
        )
        # Read where the other gauges are read: the replica, if there is one.
        for usage in key_usage(read_database(self.using or snapshots.default_database())):
            values = [usage.name, usage.kind]
            slots.add_metric(values, usage.slots)
            in_use.add_metric(values, usage.in_use)
            waiting.add_metric(values, usage.waiting)
        yield slots
        yield in_use
        yield waiting
