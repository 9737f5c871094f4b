"""Prometheus metrics of the stream job (prometheus-client, default registry).

=========================================== =====================================================
``threes_stream_snapshot_age_seconds``       time since the snapshot was last known to be at its
                                             topics' end offsets (its staleness), per snapshot
``threes_stream_snapshot_keys``              keys in the snapshot's base
``threes_stream_snapshot_overlay_records``   records in its overlay (not yet merged into the base)
``threes_stream_snapshot_refresh_seconds``   time to catch a snapshot up before a micro-batch
``threes_stream_batch_seconds``              time of a micro-batch, refresh to written records
``threes_stream_records_total``              records read/written per ``kind`` (``events``,
                                             ``enriched``, ``dead_letters``, ``updates``: a
                                             projection's and an aggregation's records)
``threes_stream_as_of_too_old_total``        events of an ``as_of`` lookup older than its
                                             snapshot's retention (no version joined), per snapshot
=========================================== =====================================================
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

log = logging.getLogger(__name__)

SNAPSHOT_AGE = Gauge(
    "threes_stream_snapshot_age_seconds", "Seconds since the snapshot was last at its topics' end offsets",
    ["job", "snapshot"],
)
SNAPSHOT_KEYS = Gauge("threes_stream_snapshot_keys", "Keys in the snapshot base", ["job", "snapshot"])
SNAPSHOT_OVERLAY = Gauge(
    "threes_stream_snapshot_overlay_records", "Records in the snapshot overlay", ["job", "snapshot"]
)
SNAPSHOT_REFRESH = Histogram(
    "threes_stream_snapshot_refresh_seconds", "Snapshot catch-up time before a micro-batch", ["job", "snapshot"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
BATCH_SECONDS = Histogram(
    "threes_stream_batch_seconds", "Micro-batch time", ["job"], buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
)
RECORDS = Counter("threes_stream_records_total", "Records read or written", ["job", "kind"])
FILTERED = Counter(
    "threes_stream_filtered_events_total", "Events the stream's `where` dropped (false or null)", ["job"]
)
LATE_EVENTS = Counter(
    "threes_stream_late_events_total",
    "Enriched events an aggregation dropped because they were older than its watermark",
    ["job", "topic"],
)

AS_OF_TOO_OLD = Counter(
    "threes_stream_as_of_too_old_total",
    "Events of an as_of lookup older than the snapshot's retention horizon: no version was joined",
    ["job", "snapshot"],
)


@dataclass(frozen=True)
class SnapshotMetrics:
    """The metric children of one snapshot."""

    keys: Any
    overlay: Any
    refresh: Any


def snapshot_metrics(job: str, snapshot: str, age_s: Callable[[], float]) -> SnapshotMetrics:
    """The metrics of a snapshot; its age is computed when scraped.

    Args:
        job: the job's name.
        snapshot: the snapshot's name.
        age_s: returns the snapshot's current age, seconds.
    """
    SNAPSHOT_AGE.labels(job, snapshot).set_function(age_s)
    return SnapshotMetrics(
        SNAPSHOT_KEYS.labels(job, snapshot),
        SNAPSHOT_OVERLAY.labels(job, snapshot),
        SNAPSHOT_REFRESH.labels(job, snapshot),
    )


def status_document() -> dict[str, Any]:
    """The stream job's part of the status document: its snapshots' keys and ages, read from the metrics.

    Returns:
        ``{"generated_at", "sources": [], "snapshots": [{"job", "snapshot", "keys", "age_s", "offsets": []}],
        "sync": [], "endpoints": []}`` (``threes status`` adds the topics' end offsets from Kafka).
    """
    from prometheus_client import REGISTRY

    from kernel.status.document import now_iso

    snaps: dict[tuple[str, str], dict[str, Any]] = {}
    for family in REGISTRY.collect():
        if family.name not in ("threes_stream_snapshot_keys", "threes_stream_snapshot_age_seconds"):
            continue
        for sample in family.samples:
            if math.isnan(sample.value):  # a real-time store that closed (its job stopped): no figure
                continue
            key = (sample.labels.get("job", ""), sample.labels.get("snapshot", ""))
            entry = snaps.setdefault(key, {"job": key[0], "snapshot": key[1], "keys": None, "age_s": None,
                                           "offsets": []})
            if family.name == "threes_stream_snapshot_keys":
                entry["keys"] = int(sample.value)
            else:
                entry["age_s"] = round(sample.value, 3)
    return {"generated_at": now_iso(), "sources": [], "snapshots": [snaps[k] for k in sorted(snaps)], "sync": [],
            "endpoints": []}


def serve(port: int, host: str = "127.0.0.1", token: str | None = None, routes: dict[str, Any] | None = None,
          fast_routes: dict[str, Any] | None = None) -> Any:
    """Serve ``/metrics``, ``/status`` and ``/status.json`` on ``port``.

    Args:
        port: TCP port (``stream.metrics_port``).
        host: the address to bind (``stream.metrics_host``, loopback by default).
        token: bearer token of every request (``stream.metrics_token``); required off loopback.
        routes: more read-only JSON routes, prefix -> ``(path, query) -> (status, document)``
            (the job's interactive queries, ``/snapshots``).
        fast_routes: prefix -> the route's answer when it is microseconds, else ``None``
            (run on the server's event loop: :meth:`~kernel.status.http.StatusServer.add_route`).

    Returns:
        The :class:`~kernel.status.http.StatusServer`.

    Raises:
        ConfigError: ``host`` is not loopback and there is no token.
    """
    from kernel.status.http import StatusServer

    server = StatusServer(status_document, title="threes stream job")
    for prefix, route in (routes or {}).items():
        server.add_route(prefix, route, fast=(fast_routes or {}).get(prefix))
    server.serve(port, host, token)
    return server
