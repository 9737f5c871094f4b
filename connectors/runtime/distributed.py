"""Spread source tasks over worker processes with Kafka's consumer group protocol.

No coordinator of our own: every worker of a group subscribes to a task topic
``_threes_tasks.<group>`` whose partition *i* stands for the *i*-th task of the
config (tasks sorted by offsets key, so every worker started with the same
config file agrees on the numbering). The group coordinator in the broker
assigns the partitions; a worker runs the tasks whose partitions it was given.
Nothing is ever produced to that topic: it exists only to be assigned.

* A worker that joins or leaves triggers a rebalance; the eager protocol calls
  ``on_revoke`` on every member *before* partitions move, and this worker stops
  the revoked tasks there, synchronously, flushing their records and storing
  their positions. The next owner starts from exactly that position.
* A worker that dies (kill -9) stops heartbeating; after
  ``session_timeout_ms`` the coordinator gives its partitions to the others,
  which resume from the last stored positions (at least once).
* A worker that is only *paused* past its session timeout (GC, SIGSTOP, a
  frozen VM) still holds the page it read when it wakes up. Every task in
  group mode therefore writes through a transactional producer whose
  ``transactional.id`` belongs to the task, not the worker: the new owner's
  ``init_transactions`` bumps the producer epoch, which aborts the zombie's
  open transaction and makes the broker refuse its later writes and commits
  (``PRODUCER_FENCED``). Its records never become visible to ``read_committed``
  readers and its position is never stored. A generation check before each
  produce would leave a window between the check and the write; the epoch is
  checked by the broker on the write itself, as Kafka Connect does (KIP-618).

This is how Kafka Connect's distributed mode and Kafka Streams place work,
minus their config topic: the config file is the source of truth, and every
worker of a group must run the same one.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import NewPartitions

from connectors.runtime.standalone import SourceWorker, TaskSpec
from kernel.exceptions import SetupError
from kernel.kafka import clients
from kernel.kafka.topics import ensure_internal_topic, internal_topic_options

log = logging.getLogger(__name__)


def tasks_topic(group: str) -> str:
    """The topic whose partitions stand for the tasks of ``group``."""
    return f"_threes_tasks.{group}"


class DistributedWorker:
    """Run the share of ``specs`` that the consumer group assigns to this process.

    Args:
        worker: runs the tasks in threads of this process.
        specs: every task of the config, in the same order on every worker.
        group: the worker group's name (consumer group ``threes-source-<group>``).
        session_timeout_ms: how long a silent worker keeps its tasks (librdkafka
            ``session.timeout.ms``; the broker's minimum is 6000 by default).
    """

    def __init__(self, worker: SourceWorker, specs: list[TaskSpec], group: str, session_timeout_ms: int = 10_000):
        self.worker = worker
        # zombie fencing: every task of a group writes in transactions (see the module docstring)
        worker.transactional = True
        self.specs = sorted(specs, key=lambda s: s.key)
        self.group = group
        self.topic = tasks_topic(group)
        self.session_timeout_ms = session_timeout_ms
        self.assigned: list[str] = []

    def _ensure_topic(self) -> None:
        kafka = self.worker.pipeline.kafka
        kconf = kafka.librdkafka_config()
        ensure_internal_topic(
            kconf, self.topic, partitions=len(self.specs), timeout_s=kafka.request_timeout_s,
            **internal_topic_options(kafka),
        )
        admin = clients.kafka_admin(kafka)
        meta = admin.list_topics(self.topic, timeout=kafka.request_timeout_s).topics[self.topic]
        if len(meta.partitions) < len(self.specs):
            try:
                admin.create_partitions([NewPartitions(self.topic, len(self.specs))])[self.topic].result(
                    kafka.request_timeout_s)
            except KafkaException as exc:
                raise SetupError(f"cannot grow task topic {self.topic!r} to {len(self.specs)} partitions: {exc}") \
                    from exc

    def _spec(self, partition: int) -> TaskSpec | None:
        return self.specs[partition] if partition < len(self.specs) else None

    def _on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            spec = self._spec(tp.partition)
            if spec is not None:
                self.worker.start(spec)
                self.assigned.append(spec.key)
        log.info("group=%s assigned tasks=%s", self.group, sorted(self.assigned))

    def _on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        keys = [s.key for tp in partitions if (s := self._spec(tp.partition)) is not None]
        # stop before the partitions move: the next owner must start from the stored position
        self.worker.stop(keys)
        self.assigned = [k for k in self.assigned if k not in keys]
        log.info("group=%s revoked tasks=%s", self.group, sorted(keys))

    def run(self, stop: threading.Event) -> None:
        """Take part in the group until ``stop`` is set; then stop every task here and leave the group.

        Raises:
            SetupError: the task topic cannot be created or grown.
        """
        self._ensure_topic()
        consumer = clients.kafka_consumer(
            self.worker.pipeline.kafka,
            f"threes-source-{self.group}",
            partition_assignment_strategy="roundrobin",
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=max(500, self.session_timeout_ms // 5),
        )
        consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                           on_lost=self._on_revoke)
        try:
            while not stop.is_set():
                # nothing is ever produced to the task topic: poll only serves the group protocol
                msg = consumer.poll(0.5)
                if msg is not None and msg.error():
                    log.warning("group=%s: %s", self.group, msg.error())
        finally:
            self.worker.stop()
            consumer.close()
