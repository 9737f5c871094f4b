"""The Confluent wire format, through a Confluent-compatible Schema Registry.

Wire format (Confluent's "Wire format", the one its serializers write)::

    00 | 4-byte schema id (big-endian) | Avro binary body

The schema id names the writer schema in the registry. Subjects follow Confluent's
``TopicNameStrategy`` (``<topic>-key`` / ``<topic>-value``). The serializer and the
registry client are confluent-kafka's own (``confluent_kafka.schema_registry``): threes only
registers a source's schemas before its first record, so a schema the subject's
compatibility level refuses stops the source before anything is produced.

Readers do not decode the Confluent body themselves: :class:`RegistryBridge` turns a
Confluent-framed message into the single-object form threes reads everywhere else (the
writer schema fetched by id once, its CRC-64-AVRO fingerprint computed, the 5-byte prefix
swapped for the 10-byte one). The body bytes are the same Avro binary in both formats, so
the sync service's columnar decoder and the stream job's ``from_avro`` decode it unchanged,
with Avro schema resolution against their reader schema.

``mock://`` URLs give confluent-kafka's in-memory ``MockSchemaRegistryClient``; one client is
kept per ``mock://`` URL in a process, so a source and a reader in one test share it. The mock
enforces no compatibility level, so threes also checks the subject's level itself
(:func:`schemas.compatibility.check_compatibility`) before registering: the same refusal with
the mock and with a real registry, which checks again.
"""

from __future__ import annotations

import json
import logging
import struct
import threading
from typing import Any

from schemas.compatibility import check_compatibility
from schemas.exceptions import IncompatibleSchemaError, SerdeError, SetupError, UnknownSchemaError
from schemas.serde import MARKER, fingerprint, parse, schema_json
from schemas.store import InMemorySchemaStore

log = logging.getLogger(__name__)

MAGIC_BYTE = b"\x00"
CONFLUENT_HEADER_BYTES = 5  # magic byte (1) + schema id (4)

_mock_clients: dict[str, Any] = {}
_mock_lock = threading.Lock()


def registry_client(conf: dict[str, Any]) -> Any:
    """A confluent-kafka ``SchemaRegistryClient`` for ``conf``.

    Args:
        conf: the client's properties (``url``, ``basic.auth.user.info``, ``ssl.ca.location``...),
            as ``SchemaRegistryConfig.client_config()`` gives them.

    Returns:
        The client; for a ``mock://`` URL the process's one mock client of that URL.

    Raises:
        SetupError: confluent-kafka's schema registry extra is not installed.
    """
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError as exc:  # authlib / httpx2 / cachetools come with the extra
        raise SetupError(
            f"confluent-kafka's schema registry client cannot be imported ({exc})",
            hint="install confluent-kafka[avro,schemaregistry]",
        ) from exc
    url = str(conf.get("url", ""))
    if url.startswith("mock://"):
        with _mock_lock:
            if url not in _mock_clients:
                _mock_clients[url] = SchemaRegistryClient.new_client(dict(conf))
            return _mock_clients[url]
    return SchemaRegistryClient(dict(conf))


def subject_name(topic: str, *, is_key: bool) -> str:
    """Confluent's ``TopicNameStrategy``: ``<topic>-key`` or ``<topic>-value``."""
    return f"{topic}-{'key' if is_key else 'value'}"


def _registry_error(exc: Exception) -> tuple[int | None, str]:
    return getattr(exc, "http_status_code", None), getattr(exc, "error_message", None) or str(exc)


def _subject_level(client: Any, subject: str, default: str) -> str:
    """The subject's compatibility level, else the registry's global one, else ``default``."""
    from confluent_kafka.schema_registry._sync.mock_schema_registry_client import MockSchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if isinstance(client, MockSchemaRegistryClient):
        return default  # the mock keeps no compatibility levels (its get_compatibility would try HTTP)
    for name in (subject, None):
        try:
            level = client.get_compatibility(name) if name else client.get_compatibility()
        except SchemaRegistryError:
            continue  # 404: no subject-level setting
        except Exception:  # the mock client has no REST endpoint: use the default
            return default
        if level:
            return str(getattr(level, "compatibility_level", level)).rsplit(".", 1)[-1]
    return default


def register_topic_schema(
    client: Any, topic: str, schema: dict[str, Any], *, is_key: bool, default_level: str = "BACKWARD"
) -> int:
    """Register ``schema`` under the topic's subject, honouring the subject's compatibility level.

    The subject's versions are checked at its level (the registry's, else
    ``default_level``) before the registration, and the registry checks again
    when it registers (HTTP 409 on an incompatible schema).

    Args:
        client: a ``SchemaRegistryClient`` (:func:`registry_client`).
        topic: the topic; the subject is ``<topic>-key`` / ``<topic>-value``.
        schema: the Avro writer schema.
        is_key: the key's subject rather than the value's.
        default_level: the level when the registry reports none (the mock client).

    Returns:
        The registry's schema id.

    Raises:
        IncompatibleSchemaError: the level refuses the schema; nothing was registered.
        SetupError: the registry cannot be reached or refuses the credentials.
    """
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    subject = subject_name(topic, is_key=is_key)
    text = schema_json(schema)
    try:
        level = _subject_level(client, subject, default_level)
        try:
            versions = client.get_versions(subject)
        except SchemaRegistryError as exc:
            if _registry_error(exc)[0] != 404:
                raise
            versions = []
        previous = [client.get_version(subject, v).schema.schema_str for v in sorted(versions)]
        if text not in previous:
            check_compatibility(schema, previous, level, topic=topic, subject=subject)
        schema_id = int(client.register_schema(subject, Schema(text, "AVRO")))
    except IncompatibleSchemaError:
        raise
    except SchemaRegistryError as exc:
        status, message = _registry_error(exc)
        if status == 409:  # the registry's own compatibility check refused it
            raise IncompatibleSchemaError(topic, subject, "the registry's", [("", message)]) from exc
        if status in (401, 403):
            raise SetupError(f"schema registry refused the credentials for subject {subject!r}: {message}",
                             hint="check kafka.schema_registry.auth") from exc
        raise SetupError(f"schema registry error for subject {subject!r} (HTTP {status}): {message}") from exc
    except (OSError, ConnectionError) as exc:
        raise SetupError(f"schema registry cannot be reached: {exc}", hint="check kafka.schema_registry.url") from exc
    except Exception as exc:  # httpx2 transport errors are not OSError
        if type(exc).__module__.startswith(("httpx", "httpcore")):
            raise SetupError(f"schema registry cannot be reached: {exc}",
                             hint="check kafka.schema_registry.url") from exc
        raise
    log.info("registered subject=%s schema_id=%d level=%s", subject, schema_id, level)
    return schema_id


class RegistrySerializer:
    """Encode dicts in the Confluent wire format with confluent-kafka's ``AvroSerializer``.

    The schema is registered on construction (:func:`register_topic_schema`); the
    serializer then only looks it up (``auto.register.schemas`` off), so a record is
    never written under a schema the registry did not accept.

    Args:
        client: a ``SchemaRegistryClient``.
        topic: the topic the records go to.
        schema: the Avro writer schema.
        is_key: key rather than value.
        default_level: as in :func:`register_topic_schema`.

    Attributes:
        schema_id: the registry's id of the writer schema.
        header: the 5-byte Confluent prefix of every record (magic byte, schema id).

    Raises:
        IncompatibleSchemaError / SetupError: from the registration.
        SerdeError: from ``__call__`` when a value does not match the schema.
    """

    def __init__(
        self, client: Any, topic: str, schema: dict[str, Any], *, is_key: bool = False,
        default_level: str = "BACKWARD",
    ):
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        self.schema = parse(schema)
        self.schema_id = register_topic_schema(client, topic, schema, is_key=is_key, default_level=default_level)
        self.header = MAGIC_BYTE + struct.pack(">I", self.schema_id)
        self._serializer = AvroSerializer(
            client, schema_json(schema), conf={"auto.register.schemas": False, "normalize.schemas": False}
        )
        self._ctx = SerializationContext(topic, MessageField.KEY if is_key else MessageField.VALUE)

    def __call__(self, obj: Any, ctx: Any = None) -> bytes | None:
        """Encode ``obj``; ``None`` (tombstone) stays ``None``."""
        if obj is None:
            return None
        try:
            encoded: bytes | None = self._serializer(obj, ctx or self._ctx)
        except Exception as exc:  # SerializationError, fastavro's ValueError/TypeError
            raise SerdeError(f"value does not match schema {self.schema.get('name', '')!s}: {exc}") from exc
        return encoded


class RegistryBridge:
    """Turn Confluent-framed messages into single-object ones, writer schemas fetched from the registry.

    Each schema id is fetched once (confluent-kafka's client caches it too) and its
    writer schema added to ``store`` (an in-memory store, or any object with
    ``register``), so the single-object decoders find it by fingerprint.

    Args:
        client: a ``SchemaRegistryClient``.
        store: where the writer schemas go: an ``InMemorySchemaStore`` or ``SchemaStore``, added in
            this process only (never written to the schema topic).
    """

    def __init__(self, client: Any, store: Any):
        self.client = client
        self.store = store
        self._headers: dict[bytes, bytes] = {}  # 5-byte Confluent prefix -> 10-byte single-object header
        self._lock = threading.Lock()

    def header_for(self, prefix: bytes) -> bytes:
        """The single-object header of a Confluent prefix (magic byte and schema id).

        Raises:
            UnknownSchemaError: the registry has no schema of that id (a
                :class:`~schemas.exceptions.SerdeError`: the record is dead-lettered).
            SetupError: the registry cannot be reached; the caller stops (and is restarted)
                rather than dead-letter records it could decode later.
        """
        header = self._headers.get(prefix)
        if header is not None:
            return header
        schema_id = struct.unpack(">I", prefix[1:5])[0]
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            registered = self.client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if _registry_error(exc)[0] == 404:
                raise UnknownSchemaError(prefix[1:5], f"the schema registry (schema id {schema_id})") from exc
            raise SetupError(f"schema registry error reading schema id {schema_id}: {_registry_error(exc)[1]}") from exc
        except Exception as exc:  # the registry unreachable: nothing is decoded (nor dead-lettered) until it is back
            raise SetupError(f"schema registry cannot be reached reading schema id {schema_id}: {exc}",
                             hint="check kafka.schema_registry.url") from exc
        text = registered.schema_str
        if (registered.schema_type or "AVRO") != "AVRO":
            raise SerdeError(f"schema id {schema_id} is {registered.schema_type}, not Avro")
        with self._lock:
            # in this process only: a SchemaStore's own register() would also write the schema topic
            register = InMemorySchemaStore.register if isinstance(self.store, InMemorySchemaStore) else None
            fp = register(self.store, json.loads(text)) if register else self.store.register(json.loads(text))
            header = MARKER + fp
            self._headers[prefix] = header
        log.info("schema registry id=%d is writer fingerprint=%s", schema_id, fingerprint(text).hex())
        return header

    def to_single_object(self, data: bytes | None) -> bytes | None:
        """One message value or key in single-object form; other bytes (and ``None``) unchanged.

        Raises:
            UnknownSchemaError: a Confluent prefix names an id the registry does not have.
        """
        if data is None or len(data) < CONFLUENT_HEADER_BYTES or data[:1] != MAGIC_BYTE:
            return data
        return self.header_for(bytes(data[:CONFLUENT_HEADER_BYTES])) + data[CONFLUENT_HEADER_BYTES:]

    def convert_messages(self, messages: list[Any]) -> list[Any]:
        """Rewrite the keys and values of consumed messages in place (``Message.set_key/set_value``).

        A message whose schema id the registry does not know is left as it is: the
        decoder downstream names it and dead-letters it.

        Returns:
            ``messages``.
        """
        for msg in messages:
            if msg.error():
                continue
            for get, put in ((msg.key, msg.set_key), (msg.value, msg.set_value)):
                data = get()
                if data is not None and data[:1] == MAGIC_BYTE:
                    try:
                        put(self.to_single_object(data))
                    except SerdeError as exc:
                        log.warning("topic=%s partition=%s offset=%s: %s", msg.topic(), msg.partition(),
                                    msg.offset(), exc)
        return messages
