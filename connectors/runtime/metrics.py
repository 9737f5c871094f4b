"""Prometheus metrics of the source runtime (one set per process, labelled by connector).

Counters are updated once per batch, never per record, to keep the produce loop cheap.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
