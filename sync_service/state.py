"""The sync service's state: a sink slot (a sink with its pool, limiter and buffers) and what the loop shares.

The loop's parts (:mod:`sync_service.dispatch`, :mod:`sync_service.commits`, :mod:`sync_service.status`,
:mod:`sync_service.rebalance`) are mixins of :class:`~sync_service.service.SyncService`; :class:`ServiceState`
declares the attributes they read and write, which ``SyncService.__init__`` sets.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from connectors.api.sink import Sink
from kernel.config.models import KafkaConfig
from kernel.supervision import RestartBackoff
from sync_service.batching import PartitionBuffer
from sync_service.concurrency import AdaptiveConcurrency
from sync_service.metrics import SyncMetrics
from sync_service.pause import OperatorPause
from sync_service.writer import BatchWriter, Outcome

TP = tuple[str, int]
"""A partition: (topic, partition)."""


@dataclass
class Reopened:
    """The result of opening a failed sink again (``error`` is ``None`` when it opened)."""

    slot: SinkSlot
    error: BaseException | None


@dataclass
class SinkSlot:
    """A sink with its runtime state: pool, limiter, buffers, in-flight count."""

    sink: Sink
    writer: BatchWriter
    limiter: AdaptiveConcurrency
    pool: ThreadPoolExecutor
    buffers: dict[TP, PartitionBuffer] = field(default_factory=dict)
    inflight: int = 0
    memory_paused: bool = False
    backoff: RestartBackoff | None = None
    state: str = "running"  # running, restarting (waiting for restart_at), recovering (one batch probes)
    restart_at: float = 0.0  # monotonic time of the next restart
    dead_letters: int = 0
    last_error: str | None = None
    blocked: bool = False  # the last failure was the target refusing any record (SinkBlockedError)

    def bytes(self) -> int:
        """Buffered plus in-flight bytes of this sink."""
        return sum(b.total_bytes for b in self.buffers.values())



class ServiceState:
    """The attributes the sync service's loop shares between its parts (set by ``SyncService.__init__``)."""

    kafka: KafkaConfig
    config: Any  # a SyncServiceConfig
    metrics: SyncMetrics
    slots: list[SinkSlot]
    consumer: Any
    producer: Any
    buffer_bytes: int  # the bound of the records the service holds
    _by_topic: dict[str, list[SinkSlot]]
    _stop: threading.Event
    _outcomes: queue.SimpleQueue[Outcome | Reopened]
    _fatal: BaseException | None
    _assigned: set[TP]
    _paused: set[TP]
    operator: OperatorPause
    _committed: dict[TP, int]
    _refusals_logged: dict[int, float]  # commit error code -> when last logged (monotonic s)
    _highs: dict[TP, int]
    _last_lag: float
    _last_status: float
    _status_doc: dict[str, Any]
    _step_bytes: int
