"""Supervision of a sync service: restarted in process, with backoff, when it stops on an error.

Sinks are supervised inside the service (:mod:`sync_service.service`: a failed
sink is closed, opened again after a backoff and writes its failed batch
first). What is left for this level is the service as a whole: its consumer
(a fatal Kafka error), its start-up (Kafka unreachable), a bug. The
supervisor builds a new :class:`~sync_service.service.SyncService`, which
rejoins the consumer group and resumes from the committed offsets, after
``errors.restart_backoff_s`` doubling up to ``errors.restart_max_backoff_s``
(the defaults of :class:`~kernel.config.policies.ErrorPolicy`). The metrics
and the ``/status`` endpoint outlive the restarts, so the restart count is
visible. Other services of the process never stop for it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kernel.config.models import KafkaConfig
from kernel.config.policies import ErrorPolicy
from kernel.supervision import RestartBackoff
from sync_service.metrics import SyncMetrics
from sync_service.service import SyncService

log = logging.getLogger(__name__)


class ServiceSupervisor:
    """Run one sync service until ``stop``, restarting it with backoff whenever it fails.

    Args:
        kafka: the pipeline's Kafka config.
        config: the ``sync`` entry.
        connections: the pipeline's connections by name.
        errors: restart delays (default :class:`ErrorPolicy` ()).
        serve_addr: address of the ``/metrics`` + ``/status`` endpoint (on ``config.metrics_port``;
            default ``config.metrics_host``, itself ``127.0.0.1`` by default).
    """

    def __init__(self, kafka: KafkaConfig, config: Any, connections: dict[str, Any], *,
                 errors: ErrorPolicy | None = None, serve_addr: str | None = None):
        self.kafka = kafka
        self.config = config
        self.connections = connections
        self.metrics = SyncMetrics(config.name)
        self.backoff = RestartBackoff(errors or ErrorPolicy())
        self.serve_addr: str = serve_addr or getattr(config, "metrics_host", None) or "127.0.0.1"
        self.service: SyncService | None = None
        self.state = "starting"
        self.server: Any = None

    def status(self) -> dict[str, Any]:
        """The service's status (:meth:`SyncService.status`) with the supervisor's state, restarts and error."""
        doc = dict(self.service.status()) if self.service is not None else {
            "service": self.config.name, "group": self.config.consumer_group(), "sinks": [], "partitions": [],
            "paused": [],
        }
        if self.state != "running":
            doc["state"] = self.state
            doc["last_error"] = self.backoff.last_error or doc.get("last_error")
        doc["restarts"] = self.backoff.restarts
        return doc

    def _records_out(self) -> float:
        return sum(
            sample.value
            for family in self.metrics.records_out.collect()
            for sample in family.samples
            if sample.name.endswith("_total")
        )

    def run(self, stop: threading.Event) -> None:
        """Run (and restart) the service until ``stop`` is set."""
        if self.config.metrics_port:
            token = getattr(self.config, "metrics_token", None)
            self.server = self.metrics.serve(self.config.metrics_port, self.serve_addr,
                                             status=lambda: {"sync": [self.status()]},
                                             token=token.get_secret_value() if token is not None else None)
        try:
            while not stop.is_set():
                before = self._records_out()
                self.service = SyncService(self.kafka, self.config, dict(self.connections), metrics=self.metrics,
                                           serve=False)
                self.state = "running"
                try:
                    self.service.run(stop)
                    self.state = "stopped"
                    return
                except Exception as exc:  # any failure of the service is restarted
                    if stop.is_set():
                        self.state = "stopped"
                        return
                    if self._records_out() > before:
                        self.backoff.succeeded()  # it wrote records since the last restart: delays start over
                    delay = self.backoff.failed(exc)
                    self.state = "restarting"
                    log.error("sync service=%s stopped on an error (%d in a row), restarting in %.1f s: %s",
                              self.config.name, self.backoff.failures, delay, exc)
                if not self.backoff.wait(stop, delay):
                    self.state = "stopped"
                    return
                self.backoff.restarting()
                self.metrics.service_restarts.labels(self.config.name).inc()
                log.info("sync service=%s restarting (restart %d)", self.config.name, self.backoff.restarts)
        finally:
            if self.server is not None:
                self.server.close()
