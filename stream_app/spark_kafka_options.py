"""Options of Spark's Kafka source and sink: the pipeline's Kafka config as Java client properties.

The typed security settings become the Java client's (a JAAS login module for
SASL, a PEM trust store for TLS); of ``client_config`` (librdkafka properties)
only the keys the Java client knows by the same name pass on. Reads and writes
get the job's consumer and producer defaults unless ``client_config`` sets them,
and every read is ``read_committed``.
"""

from __future__ import annotations

import logging

from kernel.config.models import KafkaConfig

log = logging.getLogger(__name__)

_JAAS = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


# librdkafka properties of ``kafka.client_config`` that the Java client knows by the same
# name and with the same meaning and values (librdkafka CONFIGURATION.md vs Kafka's
# client configs): these are passed on to Spark's Kafka source and sink. Security and
# connection settings are never taken from client_config (the typed fields decide them).
JAVA_CLIENT_SAME_NAME: frozenset[str] = frozenset(
    {
        "client.id",
        "client.dns.lookup",
        "socket.connection.setup.timeout.ms",
        "socket.connection.setup.timeout.max.ms",
        "connections.max.idle.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "retry.backoff.ms",
        "retry.backoff.max.ms",
        "metadata.max.age.ms",
        "fetch.min.bytes",
        "fetch.max.bytes",
        "max.partition.fetch.bytes",
        "isolation.level",
        "compression.type",
        "linger.ms",
        "batch.size",
        "acks",
        "enable.idempotence",
    }
)

_TYPED_PREFIXES = ("bootstrap.servers", "security.protocol", "sasl.", "ssl.")


# Producer settings of the job's Kafka writes (Spark's Kafka sink) unless the pipeline's ``client_config``
# sets them: the Java client's defaults (16 kB batches, linger 5 ms) send a micro-batch's records in small
# requests. Kafka Streams lingers 100 ms. Measured on a 50k-event micro-batch of enriched events here: the
# write took about half the time with 256 kB batches and 20 ms linger. Only on writes: a consumer warns
# about producer settings.
SINK_DEFAULTS: dict[str, str] = {"kafka.linger.ms": "20", "kafka.batch.size": "262144"}


# Consumer settings of the job's Kafka reads (Spark's Kafka source, events and snapshots) unless the pipeline's
# ``client_config`` sets them. After every poll, Spark's source asks the broker for the partition's earliest and
# latest offsets (two ListOffsets round trips), and a poll returns at most ``max.poll.records`` (500 by default):
# 100 round trips for a 25k-event partition of a micro-batch. Measured here on 50k-event micro-batches of small
# events, warm, three variants side by side: 20k records per poll with 2 MB per partition fetch 94-102k events/s,
# with 8 MB 80-100k, the defaults (500, 1 MB) 86-92k. 2 MB: every consumer Spark pools on an executor (up to 64)
# keeps about one fetch of data, so the fetch size is per-executor memory.
# ``fetch.max.wait.ms``: a read of a known offset range never gains from the broker holding a fetch for more data,
# but a fetch sent at the end of a partition's log waited the Java client's 500 ms: the micro-batch that reads up
# to the end of the events topic (availableNow) took 0.82-0.95 s against 0.3-0.4 s for the others (500k events,
# 50k per batch, four runs); with 20 ms, 0.27-0.46 s (two runs). It only counts when no record is there to return.
SOURCE_DEFAULTS: dict[str, str] = {
    "kafka.max.poll.records": "20000",
    "kafka.max.partition.fetch.bytes": str(2 << 20),
    "kafka.fetch.max.wait.ms": "20",
}


def source_options(options: dict[str, str]) -> dict[str, str]:
    """The options of a Spark Kafka read: :data:`SOURCE_DEFAULTS` under ``options`` (which win), read committed."""
    return {**SOURCE_DEFAULTS, **options, **READ_COMMITTED}


def sink_options(options: dict[str, str]) -> dict[str, str]:
    """The options of a Spark Kafka write: :data:`SINK_DEFAULTS` under ``options`` (which win)."""
    return {**SINK_DEFAULTS, **options}


def jaas_quote(value: str) -> str:
    r"""Return ``value`` as a double-quoted JAAS option value.

    Kafka's ``JaasConfig`` reads ``sasl.jaas.config`` with Java's
    ``StreamTokenizer``: inside ``"..."`` a backslash escapes the next character
    (``\\``, ``\"``, ``\n``, ``\r``, ``\t``). Escaping the backslash first keeps
    every other character as it is, so any password round-trips.

    Args:
        value: The raw option value (a user name or password).

    Returns:
        The quoted value, e.g. ``"p\"w"`` for ``p"w``.
    """
    escaped = (
        value.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'


def sasl_jaas_config(mechanism: str, username: str, password: str) -> str:
    """Return the Java client's ``sasl.jaas.config`` for PLAIN or SCRAM, values quoted by :func:`jaas_quote`.

    Raises:
        ValueError: For a mechanism other than PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    """
    if mechanism not in _JAAS:
        raise ValueError(f"no JAAS login module for sasl_mechanism {mechanism!r}")
    return f"{_JAAS[mechanism]} required username={jaas_quote(username)} password={jaas_quote(password)};"


READ_COMMITTED = {"kafka.isolation.level": "read_committed"}
"""Spark Kafka source option of every read: records of open or aborted transactions are never seen.

The sources write state topics in Kafka transactions (``exactly_once``, and
always in ``--group`` mode, KIP-618); the Java client's default isolation level
is ``read_uncommitted``, which would show records a crashed or fenced source
task never committed. librdkafka's default is already ``read_committed``; the
driver's consumers ask for it explicitly all the same.
"""


def spark_kafka_options(kafka: KafkaConfig) -> dict[str, str]:
    r"""Options of Spark's Kafka source and sink (Java client properties, ``kafka.`` prefixed).

    The typed security settings map onto the Java client: ``security_protocol``,
    ``sasl_mechanism`` with a JAAS login module (values escaped, so a ``"`` or ``\\``
    in a password is fine), ``ssl_ca_location`` as a PEM trust store (Kafka
    clients >= 2.7, KIP-651) and host name verification (``https``) whenever TLS
    is used. Of ``client_config`` (librdkafka properties), the keys in
    :data:`JAVA_CLIENT_SAME_NAME` are passed on; security and connection keys
    never are (the typed fields win), the others have no Java equivalent and are
    left out (logged once per call at debug level).

    Returns:
        ``{"kafka.bootstrap.servers": ..., ...}``; the SASL password sits in
        ``kafka.sasl.jaas.config``, which Spark redacts in its logs.
    """
    options = {
        f"kafka.{key}": str(value).lower() if isinstance(value, bool) else str(value)
        for key, value in kafka.client_config.items()
        if key in JAVA_CLIENT_SAME_NAME and not key.startswith(_TYPED_PREFIXES)
    }
    skipped = sorted(k for k in kafka.client_config if k not in JAVA_CLIENT_SAME_NAME)
    if skipped:
        log.debug("client_config keys without a Java client equivalent, not passed to Spark: %s", skipped)
    options.update(
        {
            "kafka.bootstrap.servers": kafka.bootstrap_servers,
            "kafka.security.protocol": kafka.security_protocol,
            "kafka.request.timeout.ms": str(int(kafka.request_timeout_s * 1000)),
        }
    )
    if kafka.sasl_mechanism and kafka.security_protocol.startswith("SASL"):
        options["kafka.sasl.mechanism"] = kafka.sasl_mechanism
        password = kafka.sasl_password.get_secret_value() if kafka.sasl_password else ""
        options["kafka.sasl.jaas.config"] = sasl_jaas_config(kafka.sasl_mechanism, kafka.sasl_username or "", password)
    if kafka.security_protocol.endswith("SSL"):
        options["kafka.ssl.endpoint.identification.algorithm"] = "https"
        if kafka.ssl_ca_location:
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.location"] = kafka.ssl_ca_location
    return options
