"""A source task runner's state: its progress (:class:`RunnerStats`) and what the runner's parts share.

The runner's parts (:mod:`connectors.runtime.serializers`, :mod:`connectors.runtime.produce`,
:mod:`connectors.runtime.position_commits`) are mixins of :class:`~connectors.runtime.worker.TaskRunner`;
:class:`RunnerState` declares the attributes they read and write, which ``TaskRunner.__init__`` sets.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.api.source import SourceTask
from connectors.registry import load_implementation
from connectors.runtime.columnar import ColumnarEncoder
from connectors.runtime.dead_letters import SourceDeadLetters
from connectors.runtime.offsets import OffsetStore, PositionTracker
from connectors.runtime.state import LiveKeys
from kernel.config.models import KafkaConfig, SourceConnectorConfig
from kernel.config.policies import RetryPolicy


@dataclass
class RunnerStats:
    """Progress of one task, read by the CLI's progress bar (plain ints: torn reads are harmless).

    Attributes:
        rows_read: rows/documents read from the system.
        produced: records handed to the producer.
        acked: records acknowledged by the broker.
        tombstones: tombstones produced.
        commits: positions written to the offsets topic.
        state: ``starting``, ``running``, ``caught_up``, ``stopped`` or ``failed``.
        error: the error that stopped the task, if any.
        position: the last position written.
        cycles: completed polling cycles.
        queue_full: times the producer's local queue was full and the task waited (backpressure).
        dead_letters: records sent to the dead letter topic (cannot be encoded, ``errors.tolerance: all``).
        restartable: ``False`` when the task failed in a way a restart repeats (a record that cannot be
            encoded): the supervisor leaves it failed.
    """

    rows_read: int = 0
    produced: int = 0
    acked: int = 0
    tombstones: int = 0
    commits: int = 0
    state: str = "starting"
    error: str | None = None
    position: dict[str, Any] | None = None
    cycles: int = 0
    queue_full: int = 0
    dead_letters: int = 0
    restartable: bool = True
    started: float = field(default_factory=time.monotonic)


class RunnerState:
    """The attributes a :class:`~connectors.runtime.worker.TaskRunner`'s parts share (set by its ``__init__``)."""

    config: SourceConnectorConfig
    kafka: KafkaConfig
    offsets: OffsetStore
    schema_store: Any
    key: str  # the task's offsets key
    task_id: int
    task_count: int
    retry: RetryPolicy
    offset_flush_interval_s: float
    producer_overrides: dict[str, Any]
    task: SourceTask
    transactional: bool
    transactional_id: str
    stats: RunnerStats
    key_ser: Any  # an AvroSerializer, or a RegistrySerializer (confluent_avro)
    value_ser: Any
    _connection: Any
    _queue_max_messages: int
    _tx_open: bool
    _tx_position: dict[str, Any] | None
    _tx_whole: bool
    _tx_timeout_s: float
    _fenced: bool
    _live: LiveKeys | None  # the state topic's live keys, kept between reconciliations
    _tracker: PositionTracker
    _producer: Any
    _written: dict[str, Any] | None
    _last_write: float
    _reconcile_every: float | None
    _label: str
    _value_schema: Mapping[str, Any]
    _key_names: list[str]
    _columnar: ColumnarEncoder | None
    _dead_letters: SourceDeadLetters | None  # errors.tolerance: all
    _reconciling: bool  # the records sent come from a reconciliation

    def _new_task(self) -> SourceTask:
        impl: type[SourceTask] = load_implementation(self.config)
        return impl(self.config, self._connection, kafka=self.kafka, task_id=self.task_id, task_count=self.task_count)

