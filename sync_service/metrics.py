"""Prometheus metrics of a sync service (prometheus-client), on their own registry.

Each :class:`SyncMetrics` has its own :class:`~prometheus_client.CollectorRegistry`,
so several services (or tests) in one process never collide; :meth:`serve`
exposes it over HTTP (``GET /metrics``). Labels hold names of services, sinks
and topics only, never a secret.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)


class SyncMetrics:
    """Counters, gauges and histograms of one sync service.

    Args:
        service: the sync service's name (the ``service`` label).
    """

    def __init__(self, service: str):
        self.service = service
        self.registry = CollectorRegistry()
        r = self.registry
        self.records_in = Counter(
            "threes_sync_records_in", "Records consumed from update topics", ["service", "topic"], registry=r
        )
        self.records_out = Counter(
            "threes_sync_records_out", "Records applied to a target", ["service", "sink"], registry=r
        )
        self.batch_latency = Histogram(
            "threes_sync_batch_latency_seconds",
            "Time to write one batch, retries included, seconds",
            ["service", "sink"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.retries = Counter(
            "threes_sync_retries", "Batch writes retried (transient error or backpressure)", ["service", "sink"],
            registry=r,
        )
        self.dlq = Counter(
            "threes_sync_dead_letters", "Records sent to the dead letter topic", ["service", "stage"], registry=r
        )
        self.paused = Gauge(
            "threes_sync_paused_partitions", "Partitions paused by backpressure", ["service"], registry=r
        )
        self.lag = Gauge(
            "threes_sync_consumer_lag", "High watermark minus committed offset, records", ["service", "topic"],
            registry=r,
        )
        self.freshness = Gauge(
            "threes_sync_freshness_seconds",
            "Age of the newest applied update (now minus its Kafka timestamp), seconds",
            ["service", "sink"],
            registry=r,
        )
        self.buffered_bytes = Gauge(
            "threes_sync_buffered_bytes", "Bytes of buffered and in-flight records", ["service"], registry=r
        )
        self.concurrency = Gauge(
            "threes_sync_concurrency_limit", "Requests allowed in flight to a target", ["service", "sink"],
            registry=r,
        )

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:  # noqa: S104 - scraped from outside
        """Expose the metrics at ``http://addr:port/metrics`` (a daemon thread)."""
        start_http_server(port, addr=addr, registry=self.registry)
        log.info("metrics service=%s on %s:%d/metrics", self.service, addr, port)

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (tests, the CLI's summary); 0.0 when absent."""
        v = self.registry.get_sample_value(name, {"service": self.service, **labels})
        return float(v) if v is not None else 0.0
