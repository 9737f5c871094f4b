"""The writer schemas the job decodes with: the schema topic, followed incrementally."""

from __future__ import annotations

from typing import Any

from connectors.config.models import KafkaConfig
from connectors.exceptions import SetupError
from schemas.store import SUBJECT_PREFIX, SchemaStore
from stream_app.kafka_io import RangeReader, TopicWatermarks


class WriterSchemas:
    """Writer schemas from the schema topic; new ones are read incrementally whenever the topic grew.

    The schema topic is shared by every producer, so it grows often; only the
    new records are read (writers of other entities are filtered out later,
    :func:`stream_app.plan.writers_for`).
    """

    def __init__(self, kafka: KafkaConfig, watermarks: TopicWatermarks):
        self.topic = kafka.schema_topic
        self.watermarks = watermarks
        # taken before the store's first read: the increments start at most a few records too early
        self._position = watermarks.end_offsets([self.topic]) if self._exists(watermarks) else {}
        self.store = SchemaStore(kafka.librdkafka_config(), self.topic)
        self._json = dict(self.store.schemas_json())
        self._reader = RangeReader(kafka)

    def _exists(self, watermarks: TopicWatermarks) -> bool:
        try:
            watermarks.partitions(self.topic)
        except SetupError:
            return False
        return True

    def __call__(self) -> dict[bytes, str]:
        """Known writer schemas: fingerprint -> JSON."""
        return self._json

    def register(self, schema: dict[str, Any]) -> None:
        """Register a schema the job writes with."""
        self.store.register(schema)
        self._json.update(self.store.schemas_json())

    def refresh(self) -> int:
        """Read the schema records written since the last refresh.

        Returns:
            How many records were read.
        """
        end = self.watermarks.end_offsets([self.topic])
        if end == self._position:
            return 0
        records = self._reader.read(self._position, end)
        for key, value in zip(records.column("key").to_pylist(), records.column("value").to_pylist(), strict=True):
            # the topic also records subject versions (``subject:<subject>:<version>``): not writer schemas
            if key is not None and value is not None and not key.startswith(SUBJECT_PREFIX.encode()):
                self._json[bytes.fromhex(key.decode())] = value.decode()
        self._position = end
        return records.num_rows

    def close(self) -> None:
        """Close the consumers."""
        self._reader.close()
