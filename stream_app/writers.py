"""The writer schemas the job decodes with: the schema topic, followed incrementally, and the registry's.

Topics in Confluent's wire format (``value_format``/``key_format: confluent_avro``) name their
writer schema by a registry id, not a fingerprint. :class:`RegistryWriters` lists the versions
of their subjects (``TopicNameStrategy``: ``<topic>-key``, ``<topic>-value``) and fetches each
schema once through :class:`schemas.registry.RegistryBridge`, which gives it a CRC-64-AVRO
fingerprint beside the schema topic's. The job then decodes both formats with the same
per-writer-schema ``from_avro`` branches: a Confluent prefix (magic byte, schema id) is swapped
for the single-object header of its schema in the JVM (:func:`stream_app.avro.from_confluent`).
"""

from __future__ import annotations

import logging
import struct
from typing import Any

from kernel.config.models import KafkaConfig, SchemaRegistryConfig
from kernel.exceptions import SetupError
from schemas.registry import MAGIC_BYTE, RegistryBridge, registry_client
from schemas.store import SUBJECT_PREFIX, InMemorySchemaStore, SchemaStore
from stream_app.kafka_io import RangeReader, TopicWatermarks

log = logging.getLogger(__name__)


def registry_subjects(config: Any) -> list[str]:
    """The registry subjects a ``stream:`` config reads (``TopicNameStrategy``), empty when none is confluent_avro.

    Args:
        config: a :class:`stream_app.config.StreamJobConfig`.
    """
    subjects = []
    if config.events.value_format == "confluent_avro":
        subjects.append(f"{config.events.topic}-value")
    for snap in config.snapshots:
        for field in snap.registry_formats:
            kind = "key" if field == "key_format" else "value"
            subjects += [f"{topic}-{kind}" for topic in snap.topics]
    return subjects


class RegistryWriters:
    """Writer schemas of the topics read in Confluent's wire format, from their registry subjects.

    A subject's version list is one registry request per :meth:`refresh` (a micro-batch, a
    snapshot refresh), each new version's schema one more, once; never a request per record.
    A record whose schema id is in none of the subjects (another subject name strategy, or a
    schema registered after the last refresh) does not decode: it is dead-lettered naming the id.

    Args:
        registry: ``kafka.schema_registry``.
        subjects: the subjects to follow (``<topic>-key`` / ``<topic>-value``).

    Raises:
        SetupError: from :meth:`refresh`, the registry cannot be reached.
    """

    def __init__(self, registry: SchemaRegistryConfig, subjects: list[str]):
        self.client = registry_client(registry.client_config())
        self.store = InMemorySchemaStore()
        self.bridge = RegistryBridge(self.client, self.store)
        self.subjects = sorted(set(subjects))
        self._versions: dict[str, dict[int, str]] = {s: {} for s in self.subjects}  # subject -> version -> JSON
        self._headers: dict[bytes, bytes] = {}

    def refresh(self) -> int:
        """Read the subjects' new versions.

        Returns:
            How many new versions were found.
        """
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        new = 0
        for subject in self.subjects:
            try:
                versions = self.client.get_versions(subject)
            except SchemaRegistryError as exc:
                if getattr(exc, "http_status_code", None) == 404:  # nothing registered yet
                    continue
                raise SetupError(f"schema registry error listing subject {subject!r}: {exc}") from exc
            except Exception as exc:  # transport errors (httpx)
                raise SetupError(f"schema registry cannot be reached listing subject {subject!r}: {exc}",
                                 hint="check kafka.schema_registry.url") from exc
            known = self._versions[subject]
            for version in sorted(set(versions) - set(known)):
                registered = self.client.get_version(subject, version)
                prefix = MAGIC_BYTE + struct.pack(">I", int(registered.schema_id))
                self._headers[prefix] = self.bridge.header_for(prefix)
                known[version] = registered.schema.schema_str
                new += 1
                log.info("subject=%s version=%d schema_id=%d read from the schema registry", subject, version,
                         registered.schema_id)
        return new

    def headers(self) -> dict[bytes, bytes]:
        """Confluent prefix (magic byte and 4-byte id) -> single-object header of the same writer schema."""
        return dict(self._headers)

    def schemas_json(self) -> dict[bytes, str]:
        """The registry's writer schemas by fingerprint."""
        return self.store.schemas_json()

    def version_schemas(self, subject: str) -> list[str]:
        """The JSON of a followed subject's versions, oldest first."""
        known = self._versions.get(subject, {})
        return [known[v] for v in sorted(known)]


class WriterSchemas:
    """Writer schemas from the schema topic; new ones are read incrementally whenever the topic grew.

    The schema topic is shared by every producer, so it grows often; only the
    new records are read (writers of other entities are filtered out later,
    :func:`stream_app.plan.writer_match.writers_for`).
    """

    def __init__(
        self, kafka: KafkaConfig, watermarks: TopicWatermarks, registry_subjects: list[str] | None = None
    ):
        self.topic = kafka.schema_topic
        self.watermarks = watermarks
        # taken before the store's first read: the increments start at most a few records too early
        self._position = watermarks.end_offsets([self.topic]) if self._exists(watermarks) else {}
        self.store = SchemaStore(kafka.librdkafka_config(), self.topic)
        self._json = dict(self.store.schemas_json())
        self._reader = RangeReader(kafka)
        self.registry: RegistryWriters | None = None
        if registry_subjects:
            if kafka.schema_registry is None:
                raise SetupError("confluent_avro topics need kafka.schema_registry (the registry's url)")
            self.registry = RegistryWriters(kafka.schema_registry, registry_subjects)
            self.registry.refresh()
            self._json.update(self.registry.schemas_json())

    def _exists(self, watermarks: TopicWatermarks) -> bool:
        try:
            watermarks.partitions(self.topic)
        except SetupError:
            return False
        return True

    def __call__(self) -> dict[bytes, str]:
        """Known writer schemas: fingerprint -> JSON."""
        return self._json

    def headers(self) -> dict[bytes, bytes]:
        """Confluent prefix -> single-object header of the registry's writer schemas (empty without a registry)."""
        return {} if self.registry is None else self.registry.headers()

    def version_schemas(self, subject: str) -> list[str]:
        """A subject's writer schema versions, oldest first: the registry's (its subjects), else the schema topic's."""
        if self.registry is not None and subject in self.registry.subjects:
            return self.registry.version_schemas(subject)
        return self.store.version_schemas(subject)

    def register(self, schema: dict[str, Any]) -> None:
        """Register a schema the job writes with."""
        self.store.register(schema)
        self._json.update(self.store.schemas_json())

    def refresh(self) -> int:
        """Read the schema records written since the last refresh.

        Also reads the registry subjects' new versions (confluent_avro topics).

        Returns:
            How many records were read (a new registry version counts one).
        """
        new = 0
        if self.registry is not None and self.registry.refresh():
            self._json.update(self.registry.schemas_json())
            new += 1
        end = self.watermarks.end_offsets([self.topic])
        if end == self._position:
            return new
        records = self._reader.read(self._position, end)
        for key, value in zip(records.column("key").to_pylist(), records.column("value").to_pylist(), strict=True):
            # the topic also records subject versions (``subject:<subject>:<version>``): not writer schemas
            if key is not None and value is not None and not key.startswith(SUBJECT_PREFIX.encode()):
                self._json[bytes.fromhex(key.decode())] = value.decode()
        self._position = end
        return records.num_rows + new

    def close(self) -> None:
        """Close the consumers."""
        self._reader.close()
