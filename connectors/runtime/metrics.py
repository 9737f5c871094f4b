"""Prometheus metrics of the source runtime (one set per process, labelled by connector).

Counters are updated once per batch, never per record, to keep the produce loop cheap.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

RECORDS_READ = Counter("threes_source_records_read", "rows/documents read from the source system", ["connector"])
RECORDS_ACKED = Counter(
    "threes_source_records_acked", "records acknowledged by the broker (acks=all)", ["connector"]
)
TOMBSTONES = Counter("threes_source_tombstones", "tombstones produced (deletes found)", ["connector"])
POSITION_COMMITS = Counter("threes_source_position_commits", "positions written to the offsets topic", ["connector"])
ERRORS = Counter("threes_source_errors", "errors by kind (retriable, fatal)", ["connector", "kind"])
QUEUE_FULL = Counter(
    "threes_source_queue_full", "times the producer queue was full and reading waited (backpressure)", ["connector"]
)
IN_FLIGHT = Gauge("threes_source_in_flight_records", "records produced and not yet acknowledged", ["connector"])
CYCLE_SECONDS = Histogram(
    "threes_source_cycle_seconds",
    "duration of one polling cycle (until caught up), seconds",
    ["connector"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800),
)
TASK_RESTARTS = Counter(
    "threes_source_task_restarts", "failed source tasks restarted by the supervisor", ["connector", "task"]
)


class _TaskStates:
    """A collector of ``threes_source_task_state``: one sample per task of every live worker, read at scrape time.

    Task states change inside the runners' threads many times a minute
    (running, caught_up); reading them when Prometheus scrapes keeps the produce
    loop free of metric updates.
    """

    def __init__(self) -> None:
        import weakref

        self.workers: weakref.WeakSet[Any] = weakref.WeakSet()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from kernel.supervision import TASK_STATES

        family = GaugeMetricFamily(
            "threes_source_task_state",
            "1 for the state a source task is in (starting, running, caught_up, restarting, failed, stopped), else 0",
            labels=["connector", "task", "state"],
        )
        for worker in list(self.workers):
            try:
                tasks = list(worker.stats().items())
            except RuntimeError:  # a task was added while reading (the worker's own thread): skip this scrape
                continue
            for key, stats in tasks:
                connector = key.split("#", 1)[0]
                for state in TASK_STATES:
                    family.add_metric([connector, key, state], 1.0 if stats.state == state else 0.0)
        yield family


TASK_STATES = _TaskStates()
REGISTRY.register(TASK_STATES)
