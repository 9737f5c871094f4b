"""Prometheus metrics of a sync service (prometheus-client), on their own registry.

Each :class:`SyncMetrics` has its own :class:`~prometheus_client.CollectorRegistry`,
so several services (or tests) in one process never collide; :meth:`serve`
exposes it over HTTP (``GET /metrics``). Labels hold names of services, sinks
and topics only, never a secret.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger(__name__)


class SyncMetrics:
    """Counters, gauges and histograms of one sync service.

    Args:
        service: the sync service's name (the ``service`` label).
    """

    def __init__(self, service: str):
        self.service = service
        self.registry = CollectorRegistry()
        self._flow(self.registry)
        self._pressure(self.registry)
        self._lifecycle(self.registry)

    def _flow(self, r: CollectorRegistry) -> None:
        """Records in and out, batch latency and how fresh the targets are."""
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
        self.freshness = Gauge(
            "threes_sync_freshness_seconds",
            "Age of the newest applied update (now minus its Kafka timestamp), seconds",
            ["service", "sink"],
            registry=r,
        )
        self.source_freshness = Histogram(
            "threes_sync_source_freshness_seconds",
            "Source commit (threes.source_ts header) to durable in the target, per batch, of its oldest record, "
            "seconds",
            ["service", "sink"],
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
            registry=r,
        )
        self.oldest_pending_age = Gauge(
            "threes_sync_oldest_pending_age_seconds",
            "Age of the oldest record consumed and not yet durable in the target (from its threes.source_ts, "
            "else its Kafka timestamp), seconds; 0 when nothing is pending. Updated every second, also while "
            "the target is down",
            ["service", "sink"],
            registry=r,
        )

    def _pressure(self, r: CollectorRegistry) -> None:
        """Backpressure and the consumer group: retries, dead letters, paused partitions, buffers, lag, concurrency."""
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
        self.assigned = Gauge(
            "threes_sync_assigned_partitions",
            "Partitions of the update topics assigned to this member of the consumer group (ready when above 0)",
            ["service"], registry=r,
        )
        self.lag = Gauge(
            "threes_sync_consumer_lag", "High watermark minus committed offset, records", ["service", "topic"],
            registry=r,
        )
        self.buffered_bytes = Gauge(
            "threes_sync_buffered_bytes", "Bytes of buffered and in-flight records", ["service"], registry=r
        )
        self.concurrency = Gauge(
            "threes_sync_concurrency_limit", "Requests allowed in flight to a target", ["service", "sink"],
            registry=r,
        )

    def _lifecycle(self, r: CollectorRegistry) -> None:
        """Restarts of sinks and services, and the state each sink is in."""
        self.restarts = Counter(
            "threes_sync_sink_restarts", "Failed sink tasks restarted (closed and opened again) after a backoff",
            ["service", "sink"], registry=r,
        )
        self.service_restarts = Counter(
            "threes_sync_service_restarts", "Sync services restarted after they stopped on an error", ["service"],
            registry=r,
        )
        self.sink_state = Gauge(
            "threes_sync_sink_state", "1 for the state a sink is in (running, restarting, recovering), else 0",
            ["service", "sink", "state"], registry=r,
        )

    def serve(self, port: int, addr: str = "127.0.0.1", status: Any = None, token: str | None = None) -> Any:
        """Expose the metrics at ``http://addr:port/metrics``, and ``status`` at ``/status`` and ``/status.json``.

        Args:
            port: TCP port (``0``: a free one).
            addr: the address to bind (``metrics_host``; loopback by default).
            status: returns the status document (``{"sync": [...]}``); an empty one when ``None``.
            token: bearer token of every request (``metrics_token``); required off loopback.

        Raises:
            ConfigError: ``addr`` is not loopback and there is no token.

        Returns:
            The :class:`~kernel.status.http.StatusServer` (its ``httpd`` holds the bound port).
        """
        from kernel.status.http import StatusServer

        server = StatusServer(status or (lambda: {"sync": []}), self.registry, title=f"threes sync {self.service}")
        bound = server.serve(port, addr, token)
        log.info("metrics service=%s on %s:%d/metrics", self.service, addr, bound)
        return server

    def value(self, name: str, **labels: str) -> float:
        """Current value of a sample (tests, the CLI's summary); 0.0 when absent."""
        v = self.registry.get_sample_value(name, {"service": self.service, **labels})
        return float(v) if v is not None else 0.0
