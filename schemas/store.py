"""Writer schemas kept in a compacted Kafka topic, keyed by fingerprint.

The key of each record is the 8-byte CRC-64-AVRO fingerprint as 16 hex
characters; the value is the full schema JSON (logical types, defaults and
docs kept, which the Parsing Canonical Form drops). The topic is compacted, so
it holds one record per schema forever. Any process can resolve a fingerprint
it has not seen by reading the topic to its end, the way Kafka Connect workers
read ``connect-configs``.

The same topic records the *versions of each subject* (a topic's key or value
schema, ``<topic>-key`` / ``<topic>-value``): key ``subject:<subject>:<version>``
(version zero-padded to 10 digits), value ``{"subject", "version",
"fingerprint"}``. A new version is appended only after
:func:`schemas.compatibility.check_compatibility` accepted it, so the versions
are what compatibility is checked against, as in a schema registry.

Fingerprints are of the logical canonical form (:func:`schemas.serde.fingerprint`).
Records written before it (plain Parsing Canonical Form fingerprints) still
decode: every stored record maps the fingerprint it was written under to the
full schema JSON, whichever form computed it.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from schemas.exceptions import SchemaRegistrationError, UnknownSchemaError
from schemas.serde import Schema, fingerprint, parse, schema_json

log = logging.getLogger(__name__)

SUBJECT_PREFIX = "subject:"


def subject_record_key(subject: str, version: int) -> str:
    """The schema topic's key of one subject version: ``subject:<subject>:<version, 10 digits>``."""
    return f"{SUBJECT_PREFIX}{subject}:{version:010d}"


class InMemorySchemaStore:
    """A schema store inside one process (unit tests, one-off tools)."""

    def __init__(self) -> None:
        self._schemas: dict[bytes, Any] = {}
        self._json: dict[bytes, str] = {}
        self._subjects: dict[str, dict[int, bytes]] = {}

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

    def versions(self, subject: str) -> list[bytes]:
        """The fingerprints of a subject's versions, oldest first (empty when it has none)."""
        known = self._subjects.get(subject, {})
        return [known[v] for v in sorted(known)]

    def version_schemas(self, subject: str) -> list[str]:
        """The schema JSON of each of a subject's versions, oldest first.

        Raises:
            UnknownSchemaError: a version names a fingerprint whose schema is missing.
        """
        return [self.get_json(fp) for fp in self.versions(subject)]

    def add_version(self, subject: str, schema: Schema, fp: bytes | None = None) -> int:
        """Register ``schema`` and append it as the subject's next version (no check here).

        Args:
            subject: the subject.
            schema: the schema.
            fp: the fingerprint the schema is already stored under when it is not
                today's (a key framed with a Parsing Canonical Form fingerprint).

        Returns:
            The new version number (1 for the first); the current one when
            ``schema`` already is the latest version.
        """
        fp = self.register(schema) if fp is None or fp == fingerprint(schema) else fp
        known = self._subjects.setdefault(subject, {})
        if known and known[max(known)] == fp:
            return max(known)
        version = max(known, default=0) + 1
        known[version] = fp
        return version


class SchemaStore(InMemorySchemaStore):
    """Writer schemas in a compacted topic (see module docstring).

    Args:
        kafka_config: librdkafka properties (``KafkaConfig.librdkafka_config()``).
        topic: the schema topic; created compacted when missing.
        timeout_s: how long a registration or a catch-up read may take, seconds.
        replication_factor: of the topic when created; ``None``: min(3, brokers)
            (:func:`schemas.kafka_admin.replication_settings`).
        min_insync_replicas: of the topic when created; ``None``: the default there.
        create: create the topic when it is missing; ``False`` only reads it (``threes check``
            must not create anything: the caller checks that the topic exists first).

    Raises:
        SetupError / ConfigError: from construction, when the topic cannot be
            created or exists without ``cleanup.policy=compact``, or (``create=False``)
            cannot be read.
    """

    def __init__(
        self,
        kafka_config: dict[str, Any],
        topic: str = "_threes_schemas",
        timeout_s: float = 30.0,
        *,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        create: bool = True,
    ):
        super().__init__()
        from schemas.kafka_admin import ensure_internal_topic

        self.kafka_config = dict(kafka_config)
        self.topic = topic
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        if create:
            ensure_internal_topic(
                self.kafka_config,
                topic,
                partitions=1,
                replication_factor=replication_factor,
                min_insync_replicas=min_insync_replicas,
            )
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
            self._produce(fp.hex(), schema_json(schema))
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

    def versions(self, subject: str) -> list[bytes]:
        """The fingerprints of a subject's versions, oldest first, read from the topic."""
        self.refresh()
        return super().versions(subject)

    def add_version(self, subject: str, schema: Schema, fp: bytes | None = None) -> int:
        """Register ``schema`` and append it to the subject in the topic (acknowledged by the broker).

        ``fp``: as in :meth:`InMemorySchemaStore.add_version`.

        Two processes appending to one subject at once may both write the same
        version number; the later record wins (the subject is owned by one
        source, so this needs two instances of one source).

        Returns:
            The version number.

        Raises:
            SchemaRegistrationError: the broker did not acknowledge the record in time.
        """
        fp = self.register(schema) if fp is None or fp == fingerprint(schema) else fp
        self.refresh()
        with self._lock:
            known = self._subjects.setdefault(subject, {})
            if known and known[max(known)] == fp:
                return max(known)
            version = max(known, default=0) + 1
            value = json.dumps({"subject": subject, "version": version, "fingerprint": fp.hex()})
            self._produce(subject_record_key(subject, version), value)
            known[version] = fp
        log.info("subject=%s version=%d fingerprint=%s topic=%s", subject, version, fp.hex(), self.topic)
        return version

    def _produce(self, key: str, value: str) -> None:
        if self._producer is None:
            self._producer = Producer({**self.kafka_config, "acks": "all", "enable.idempotence": True})
        errors: list[Any] = []
        self._producer.produce(
            self.topic,
            key=key.encode(),
            value=value.encode(),
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
        remaining = self._producer.flush(self.timeout_s)
        if remaining or errors:
            raise SchemaRegistrationError(
                f"record {key} not acknowledged by topic {self.topic!r}: {errors or 'timeout'}"
            )

    def refresh(self) -> int:
        """Read the schema topic from the beginning to its current end.

        Returns:
            How many schemas are known afterwards.

        Raises:
            SetupError: the topic's offsets could not be read within ``timeout_s`` (a partition
                without a leader for a moment, just after the topic was created, is asked again
                until then: :func:`schemas.kafka_admin.watermark_offsets`).
        """
        from schemas.kafka_admin import watermark_offsets

        consumer = Consumer(
            {
                **self.kafka_config,
                "group.id": f"threes-schemas-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        try:
            low, high = watermark_offsets(consumer, self.topic, 0, self.timeout_s)
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
                offset, value, raw_key = msg.offset(), msg.value(), msg.key()
                position = (offset if offset is not None else position) + 1
                if value is None or raw_key is None:
                    continue
                key = raw_key.decode()
                if key.startswith(SUBJECT_PREFIX):
                    doc = json.loads(value)
                    with self._lock:
                        self._subjects.setdefault(doc["subject"], {})[int(doc["version"])] = bytes.fromhex(
                            doc["fingerprint"])
                    continue
                fp = bytes.fromhex(key)
                with self._lock:
                    if fp not in self._schemas:
                        self._schemas[fp] = parse(value.decode())
                        self._json[fp] = value.decode()
        finally:
            consumer.close()
        return len(self._schemas)
