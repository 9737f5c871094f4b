"""Writer schemas kept in a compacted Kafka topic, keyed by fingerprint.

The key of each record is the 8-byte CRC-64-AVRO fingerprint as 16 hex
characters; the value is the full schema JSON (logical types, defaults and
docs kept, which the Parsing Canonical Form drops). The topic is compacted, so
it holds one record per schema forever. Any process can resolve a fingerprint
it has not seen by reading the topic to its end, the way Kafka Connect workers
read ``connect-configs``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from schemas.exceptions import SchemaRegistrationError, UnknownSchemaError
from schemas.serde import Schema, fingerprint, parse, schema_json

log = logging.getLogger(__name__)


class InMemorySchemaStore:
    """A schema store inside one process (unit tests, one-off tools)."""

    def __init__(self) -> None:
        self._schemas: dict[bytes, Any] = {}
        self._json: dict[bytes, str] = {}

    def register(self, schema: Schema) -> bytes:
        """Store a writer schema.

        Returns:
            Its 8-byte fingerprint.
        """
        fp = fingerprint(schema)
        if fp not in self._schemas:
            self._schemas[fp] = parse(schema)
            self._json[fp] = schema_json(schema)
        return fp

    def get(self, fp: bytes) -> Any:
        """Return the parsed writer schema of a fingerprint.

        Raises:
            UnknownSchemaError: never registered here.
        """
        try:
            return self._schemas[fp]
        except KeyError:
            raise UnknownSchemaError(fp, "the in-memory schema store") from None

    def get_json(self, fp: bytes) -> str:
        """The writer schema JSON of a fingerprint (logical types and defaults kept).

        Raises:
            UnknownSchemaError: never registered here.
        """
        self.get(fp)
        return self._json[fp]

    def schemas_json(self) -> dict[bytes, str]:
        """All known writer schemas: fingerprint -> schema JSON."""
        return dict(self._json)


class SchemaStore(InMemorySchemaStore):
    """Writer schemas in a compacted topic (see module docstring).

    Args:
        kafka_config: librdkafka properties (``KafkaConfig.librdkafka_config()``).
        topic: the schema topic; created compacted when missing.
        timeout_s: how long a registration or a catch-up read may take, seconds.

    Raises:
        SetupError / ConfigError: from construction, when the topic cannot be
            created or exists without ``cleanup.policy=compact``.
    """

    def __init__(self, kafka_config: dict[str, Any], topic: str = "_threes_schemas", timeout_s: float = 30.0):
        super().__init__()
        from connectors.topics import ensure_compacted_topic

        self.kafka_config = dict(kafka_config)
        self.topic = topic
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        ensure_compacted_topic(self.kafka_config, topic, partitions=1)
        self.refresh()

    def register(self, schema: Schema) -> bytes:
        """Store a writer schema in the topic (once per process and schema).

        Returns:
            Its 8-byte fingerprint.

        Raises:
            SchemaRegistrationError: the broker did not acknowledge the record in time.
        """
        fp = fingerprint(schema)
        with self._lock:
            if fp in self._schemas:
                return fp
            if self._producer is None:
                self._producer = Producer({**self.kafka_config, "acks": "all", "enable.idempotence": True})
            errors: list[Any] = []
            self._producer.produce(
                self.topic,
                key=fp.hex().encode(),
                value=schema_json(schema).encode(),
                on_delivery=lambda err, _msg: errors.append(err) if err else None,
            )
            remaining = self._producer.flush(self.timeout_s)
            if remaining or errors:
                raise SchemaRegistrationError(
                    f"schema {fp.hex()} not acknowledged by topic {self.topic!r}: {errors or 'timeout'}"
                )
            super().register(schema)
            log.info("registered Avro schema fingerprint=%s topic=%s", fp.hex(), self.topic)
        return fp

    def get(self, fp: bytes) -> Any:
        """Return the writer schema of a fingerprint, reading the topic on a miss.

        Raises:
            UnknownSchemaError: not in the topic either.
        """
        if fp not in self._schemas:
            self.refresh()
        if fp not in self._schemas:
            raise UnknownSchemaError(fp, f"schema topic {self.topic!r}")
        return self._schemas[fp]

    def refresh(self) -> int:
        """Read the schema topic from the beginning to its current end.

        Returns:
            How many schemas are known afterwards.
        """
        consumer = Consumer(
            {
                **self.kafka_config,
                "group.id": f"threes-schemas-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        try:
            tp = TopicPartition(self.topic, 0)
            low, high = consumer.get_watermark_offsets(tp, timeout=self.timeout_s)
            if high <= low:
                return len(self._schemas)
            consumer.assign([TopicPartition(self.topic, 0, low)])
            position = low
            while position < high:
                msg = consumer.poll(self.timeout_s)
                if msg is None:
                    break
                if msg.error():
                    raise KafkaException(msg.error())
                position = msg.offset() + 1
                if msg.value() is None:
                    continue
                fp = bytes.fromhex(msg.key().decode())
                with self._lock:
                    if fp not in self._schemas:
                        self._schemas[fp] = parse(msg.value().decode())
                        self._json[fp] = msg.value().decode()
        finally:
            consumer.close()
        return len(self._schemas)
