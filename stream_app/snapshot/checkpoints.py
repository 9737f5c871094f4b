"""When a live snapshot's checkpoint is written, and whether the newest one can be loaded.

A :class:`CheckpointSchedule` keeps the time and offsets of the last
checkpoint, starts a write when the interval has passed (the driver's Arrow
table is written by a background thread) and, at a restart, tells whether the
newest checkpoint still describes the topics: its offsets inside the topics'
offset ranges and its age below their ``delete.retention.ms`` (older, a
tombstone it never saw may be gone).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pyarrow as pa

from kernel.config.models import KafkaConfig
from stream_app.checkpoint import SnapshotCheckpoint
from stream_app.kafka_io import Offsets, TopicWatermarks
from stream_app.snapshot_config import SnapshotConfig

log = logging.getLogger(__name__)


class CheckpointSchedule:
    """The checkpoints of one snapshot (see module docstring).

    Args:
        kafka: the pipeline's Kafka config.
        cfg: the snapshot's config (topics, ``checkpoint_interval_s``).
        watermarks: start and end offsets of the topics.
        checkpoint: where its checkpoints go, or ``None``.
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        cfg: SnapshotConfig,
        watermarks: TopicWatermarks,
        checkpoint: SnapshotCheckpoint | None,
    ):
        self.kafka, self.cfg, self.watermarks, self.checkpoint = kafka, cfg, watermarks, checkpoint
        self.name = cfg.name
        self._last_checkpoint: tuple[float, dict[str, dict[int, int]] | None] = (time.monotonic(), None)
        self._checkpoint_thread: threading.Thread | None = None

    def due(self, offsets: Offsets, force: bool) -> bool:
        """Whether to checkpoint the snapshot at ``offsets`` now (a running write is waited for when forced).

        Not when there is no checkpoint location, nothing changed since the last
        one, the interval has not passed (unless ``force``), or a write is still
        running (unless ``force``).
        """
        if self.checkpoint is None:
            return False
        last_at, last_offsets = self._last_checkpoint
        if last_offsets == offsets or (not force and time.monotonic() - last_at < self.cfg.checkpoint_interval_s):
            return False
        if self._checkpoint_thread is not None and self._checkpoint_thread.is_alive():
            if not force:
                return False
            self._checkpoint_thread.join()
        return True

    def written(self, offsets: Offsets) -> None:
        """Note a checkpoint at ``offsets`` (a partitioned version the executors wrote, or one being saved)."""
        self._last_checkpoint = (time.monotonic(), {t: dict(p) for t, p in offsets.items()})

    def save_in_background(self, table: pa.Table, offsets: Offsets) -> None:
        """Write ``table`` at ``offsets`` by a background thread (a failure is logged; the next interval retries)."""
        self.written(offsets)
        checkpoint = self.checkpoint
        assert checkpoint is not None

        def save() -> None:
            try:
                checkpoint.save(table, offsets)
            except Exception:  # the next interval tries again; a restart without it reads the topics
                log.exception("snapshot=%s checkpoint failed", self.name)

        self._checkpoint_thread = threading.Thread(target=save, name=f"snapshot-checkpoint-{self.name}", daemon=True)
        self._checkpoint_thread.start()

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for a checkpoint being written."""
        if self._checkpoint_thread is not None:
            self._checkpoint_thread.join(timeout_s)

    def usable(self, ends: Offsets) -> Any:
        """The newest checkpoint if it still describes the topics, else ``None`` (read them all)."""
        if self.checkpoint is None:
            return None
        loaded = self.checkpoint.load()
        if loaded is None:
            return None
        starts = self.watermarks.start_offsets(self.cfg.topics)
        for topic, parts in loaded.offsets.items():
            for partition, offset in parts.items():
                low = starts.get(topic, {}).get(partition, 0)
                high = ends.get(topic, {}).get(partition, 0)
                if not low <= offset <= high:
                    log.warning(
                        "snapshot=%s checkpoint offset %s[%d]=%d outside [%d, %d]: reading the topics",
                        self.name,
                        topic,
                        partition,
                        offset,
                        low,
                        high,
                    )
                    return None
        age = time.time() - loaded.written_at
        retention = self._tombstone_retention_s()
        if retention is not None and age >= retention:
            log.warning(
                "snapshot=%s checkpoint is %.0f s old, past delete.retention.ms (%.0f s): tombstones may "
                "be gone, reading the topics",
                self.name,
                age,
                retention,
            )
            return None
        return loaded

    def _tombstone_retention_s(self) -> float | None:
        from kernel.kafka.topics import topic_configs

        values = []
        for topic in self.cfg.topics:
            value = topic_configs(self.kafka.librdkafka_config(), topic).get("delete.retention.ms")
            if value is not None:
                values.append(int(value) / 1000)
        return min(values) if values else None
