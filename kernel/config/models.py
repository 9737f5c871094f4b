"""Config models shared by every part: Kafka, the schema registry, connections, connector bases.

All models forbid unknown keys (a typo is an error, not a silently ignored
setting) and keep secrets in :class:`pydantic.SecretStr`, so ``repr``, logs and
errors show ``**********``. Units are in the field names: ``_s`` seconds,
``_ms`` milliseconds, ``_bytes`` bytes, ``records`` counts. Their field types and base model are in
:mod:`kernel.config.fields`, the shared policies (retries, errors, batches, topics) in
:mod:`kernel.config.policies`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from kernel.config.fields import Name, SchemaRef, StrictModel, TopicName, WireFormat
from kernel.config.policies import ErrorPolicy, TopicSpec


class SchemaRegistryAuth(StrictModel):
    """HTTP basic authentication to the schema registry (Confluent's ``basic.auth.user.info``)."""

    username: str
    password: SecretStr


class SchemaRegistryTls(StrictModel):
    """TLS to the schema registry: the CA that signed its certificate, and a client certificate for mTLS."""

    ca_location: str | None = Field(None, description="PEM file of the CA that signed the registry's certificate")
    certificate_location: str | None = Field(None, description="PEM client certificate (mutual TLS)")
    key_location: str | None = Field(None, description="PEM private key of the client certificate")


class SchemaRegistryConfig(StrictModel):
    """A Confluent-compatible Schema Registry (Confluent's own, Apicurio's ``ccompat`` API, Karapace...).

    Used where a topic's ``value_format``/``key_format`` is ``confluent_avro``; ``mock://<name>`` is
    confluent-kafka's in-memory mock client (tests, one process only).
    """

    url: str = Field(pattern=r"^(https?|mock)://\S+$", description="http(s)://host:port[/path] of the registry")
    auth: SchemaRegistryAuth | None = None
    tls: SchemaRegistryTls | None = None
    request_timeout_s: float = Field(10.0, gt=0, description="timeout of one registry request, seconds")

    def client_config(self) -> dict[str, Any]:
        """Return confluent-kafka ``SchemaRegistryClient`` properties, secrets revealed (pass only to the client)."""
        conf: dict[str, Any] = {"url": self.url, "timeout": self.request_timeout_s}
        if self.auth is not None:
            conf["basic.auth.user.info"] = f"{self.auth.username}:{self.auth.password.get_secret_value()}"
        if self.tls is not None:
            if self.tls.ca_location:
                conf["ssl.ca.location"] = self.tls.ca_location
            if self.tls.certificate_location:
                conf["ssl.certificate.location"] = self.tls.certificate_location
            if self.tls.key_location:
                conf["ssl.key.location"] = self.tls.key_location
        return conf


class KafkaConfig(StrictModel):
    """How every part reaches Kafka.

    ``client_config`` passes other librdkafka properties through
    (https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md), from an
    allow-list of known-safe ones (:mod:`kernel.config.safety`): a property that
    loads code or files, runs a command, turns verification off or overrides a typed
    setting is a validation error naming it and why. Secrets belong in the typed
    fields, which are masked. Producers default to ``linger.ms`` 20 and lz4
    compression, which ``client_config`` may change; ``acks=all`` and idempotence
    always hold.
    """

    bootstrap_servers: str = Field(description="host:port[,host:port...] of the brokers")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    client_config: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="other librdkafka properties, from an allow-list of known-safe ones (tuning: linger.ms, "
        "client.id, fetch sizes...); security and connection settings come from the typed fields only",
    )
    schema_topic: TopicName = Field(
        "_threes_schemas",
        description="compacted topic holding Avro writer schemas keyed by fingerprint",
    )
    schema_registry: SchemaRegistryConfig | None = Field(
        None,
        description="a Confluent-compatible Schema Registry, for topics whose value_format/key_format is "
        "confluent_avro; without it every topic uses the single-object format and kafka.schema_topic",
    )
    internal_replication_factor: int | None = Field(
        None,
        ge=1,
        description="replication factor of the topics threes creates (_threes_schemas, _threes_offsets, "
        "the task topics of --group workers, state topics without their own topic_spec.replication_factor, "
        "dead letter, update, enriched and events topics); default min(3, number of brokers)",
    )
    internal_min_insync_replicas: int | None = Field(
        None,
        ge=1,
        description="min.insync.replicas of the topics threes creates; default replication factor - 1 "
        "(at least 1, at most 2): with acks=all a write survives the loss of any one broker",
    )
    request_timeout_s: float = Field(10.0, gt=0, description="timeout of admin/metadata calls")

    @field_validator("client_config")
    @classmethod
    def _allow_listed_passthrough(cls, value: dict[str, Any]) -> dict[str, Any]:
        from kernel.config.safety import kafka_client_config_problems

        problems = kafka_client_config_problems(value)
        if problems:
            raise ValueError("; ".join(f"'{key}' refused: {why}" for key, why in problems))
        return value

    def librdkafka_config(self) -> dict[str, Any]:
        """Return the librdkafka properties, secrets revealed (pass only to the client).

        Returns:
            A dict for ``confluent_kafka`` ``Producer``/``Consumer``/``AdminClient``.
        """
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        if self.ssl_ca_location:
            conf["ssl.ca.location"] = self.ssl_ca_location
        conf.update(self.client_config)
        return conf


class ConnectionConfig(StrictModel):
    """Base of a named connection (``connections:`` in the YAML); one subclass per technology.

    A technology's subpackage defines its connection model (``connectors/<tech>/connection.py``), with
    ``type`` a ``Literal`` of its registry key, and registers it in the ``threes.connections``
    entry-point group; the pipeline document's ``connections`` is the discriminated union of every
    registered model (:func:`connectors.registry.connection_models`). The subclass also owns its
    client factory and :meth:`check`.

    Class attributes:
        client_loggers: the client libraries' logger names, silenced while ``threes check`` runs
            (each failure is reported once, as one result line).
    """

    client_loggers: ClassVar[tuple[str, ...]] = ()

    type: str

    def check(self, name: str, users: Sequence[ConnectorConfig]) -> list[CheckResult]:
        """Reach the system read-only (``threes check``), without side effects.

        Args:
            name: the connection's name in the YAML (for messages and hints).
            users: the connectors of the pipeline that use this connection (an S3 connection
                checks each bucket they name).

        Returns:
            One result per thing checked; a failure is a result, never an exception.
        """
        raise NotImplementedError(f"connection type {self.type!r} has no check")

    def local_services(self) -> tuple[str, ...]:
        """The services of the local stack (``threes local up``) this connection reaches.

        ``threes demo`` starts only the services its pipeline's connections declare
        (:func:`threes.local.needs.services_for_pipeline`). Names are those of
        :data:`threes.local.registry.SERVICES` (``postgres``, ``mysql``, ``elasticsearch``, ``s3``);
        a technology the local stack does not run declares none (the default).

        Returns:
            Service names, possibly empty.
        """
        return ()


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check of ``threes check``.

    Attributes:
        system: the connection's type (``kafka``, ``rds``, ``elasticsearch``, ``s3``...).
        target: what was checked (connection name, bucket...), never a secret.
        ok: whether it answered as expected.
        detail: what was seen (version, status) or what failed.
        hint: what to do about a failure.
    """

    system: str
    target: str
    ok: bool
    detail: str
    hint: str = ""


class ConnectorConfig(StrictModel):
    """Fields every connector has. Subclasses set ``type`` to a ``Literal`` registry key.

    Class attributes:
        implementation: ``"module:Class"`` of the connector, imported only when it runs.
        connection_type: the ``type`` of connection the connector needs.
        role: ``"source"`` or ``"sink"``.
    """

    implementation: ClassVar[str]
    connection_type: ClassVar[str]
    role: ClassVar[Literal["source", "sink"]]

    name: Name
    type: str
    connection: Name = Field(description="name of an entry under `connections`")
    errors: ErrorPolicy = Field(
        default_factory=ErrorPolicy, description="retry timeout, tolerance and restarts of failed tasks"
    )


class SourceConnectorConfig(ConnectorConfig):
    """Fields every source connector has."""

    role: ClassVar[Literal["source", "sink"]] = "source"

    topic: TopicName = Field(description="compacted topic the entities are written to")
    topic_spec: TopicSpec = Field(default_factory=TopicSpec)
    key: list[str] | None = Field(None, description="entity key field(s); default: the system's own key")
    rekey: bool = Field(
        False,
        description="allow a key schema change (a primary key column int -> bigint): the source tombstones "
        "every old key, then re-snapshots under the new key; without it a key schema change stops the source",
    )

    dead_letter_topic: TopicName | None = Field(
        None,
        description="with errors.tolerance: all, where a row or change that cannot be encoded goes (created if "
        "missing; headers dlq.* with stage encode and dlq.source.table, dlq.source.key, dlq.source.column, "
        "dlq.source.position); default <topic>.dlq",
    )

    @property
    def dead_letter_topic_name(self) -> str:
        """The source's dead letter topic: ``dead_letter_topic``, default ``<topic>.dlq``."""
        return self.dead_letter_topic or f"{self.topic}.dlq"

    value_format: WireFormat = Field(
        "avro",
        description="avro: single-object encoding, writer schemas in kafka.schema_topic; confluent_avro: Confluent's "
        "wire format, the schema registered under <topic>-value (TopicNameStrategy) in kafka.schema_registry before "
        "the first record, refused when the subject's compatibility level forbids it",
    )
    key_format: WireFormat = Field("avro", description="as value_format, for keys (subject <topic>-key)")

    @model_validator(mode="after")
    def _registry_formats_do_not_rekey(self) -> SourceConnectorConfig:
        if self.key_format != self.value_format:
            raise ValueError("key_format and value_format: a source writes its keys and values in one format")
        if self.rekey and "confluent_avro" in (self.key_format, self.value_format):
            raise ValueError("rekey: not available with confluent_avro topics (the registry's subject keeps "
                             "one key schema history; migrate to a new topic instead)")
        return self

    value_schema: SchemaRef | None = Field(
        None, description="Avro schema (.avsc path relative to the config file's folder, or name in schemas/)"
    )
    poll_interval_s: float = Field(5.0, gt=0)
    batch_records: int = Field(10_000, ge=1)
    exactly_once: bool = Field(
        False,
        description="write records and the task's position in one Kafka transaction (KIP-618): a crash neither "
        "loses nor duplicates a record for read_committed readers; always on in --group mode (zombie fencing)",
    )


class SinkConnectorConfig(ConnectorConfig):
    """Fields every sink connector has.

    ``max_record_bytes`` is a per-record limit: a record larger than it (key and value
    bytes as consumed) is dead-lettered with the reason instead of being sent, so one
    record the target can never take does not hold its partition. When unset, the
    sink's target limit applies (``Sink.default_max_record_bytes``).
    """

    role: ClassVar[Literal["source", "sink"]] = "sink"

    topics: list[TopicName] = Field(min_length=1, description="update topics this sink applies")
    max_record_bytes: int | None = Field(
        None,
        ge=1,
        description="largest record the sink writes, bytes of key and value as consumed; a larger one goes to the "
        "dead letter topic with the reason, unsent. Default: the target's own limit (Elasticsearch's "
        "http.max_content_length, 100 MiB; PostgreSQL's 1 GiB per field; none for S3)",
    )

