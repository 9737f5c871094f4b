"""Kafka from the stream job: Spark's Kafka source/sink options, offset ranges, watermarks.

Offsets are ``{topic: {partition: offset}}`` where ``offset`` is the *next*
offset to read (Kafka's position / high watermark convention), so a range
``[start, end)`` is empty when ``start == end``. JSON renderings use Spark's
``startingOffsets``/``endingOffsets`` format (``{"t":{"0":42}}``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from kernel.config.models import KafkaConfig
from kernel.exceptions import FatalError, SetupError

log = logging.getLogger(__name__)

Offsets = dict[str, dict[int, int]]

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


def offsets_json(offsets: Mapping[str, Mapping[int, int]]) -> str:
    """Render offsets in Spark's JSON format, keys sorted (stable in logs and headers)."""
    return json.dumps(
        {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(offsets.items())},
        separators=(",", ":"),
    )


def parse_offsets(text: str) -> Offsets:
    """Inverse of :func:`offsets_json`."""
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in json.loads(text).items()}


def count_between(start: Mapping[str, Mapping[int, int]], end: Mapping[str, Mapping[int, int]]) -> int:
    """How many offsets lie in ``[start, end)`` over all partitions (records, an upper bound after compaction)."""
    return sum(max(0, o - start.get(t, {}).get(p, 0)) for t, parts in end.items() for p, o in parts.items())


def read_range(spark: Any, kafka: KafkaConfig, start: Offsets | None, end: Offsets, headers: bool = False) -> Any:
    """Batch-read the records in ``[start, end)`` of some topics with Spark's Kafka source.

    Args:
        spark: the SparkSession.
        kafka: the pipeline's Kafka config.
        start: first offsets to read; ``None`` reads from the earliest offsets.
            A partition missing from ``start`` is read from its earliest offset.
        end: offsets to stop before (exclusive); partitions with nothing to read
            are skipped.
        headers: also read the records' headers (column ``headers``).

    Returns:
        Spark's Kafka DataFrame (``key, value, topic, partition, offset,
        timestamp, timestampType[, headers]``), or ``None`` when the range is empty.
    """
    start = start or {}
    wanted: Offsets = {}
    first: dict[str, dict[str, int]] = {}
    for topic, parts in end.items():
        for partition, stop in parts.items():
            begin = start.get(topic, {}).get(partition, -2)  # -2: earliest
            if begin != -2 and begin >= stop:
                continue
            wanted.setdefault(topic, {})[partition] = stop
            first.setdefault(topic, {})[str(partition)] = begin
    if not wanted:
        return None
    reader = spark.read.format("kafka")
    for key, value in source_options(spark_kafka_options(kafka)).items():
        reader = reader.option(key, value)
    return (
        reader.option("assign", json.dumps({t: sorted(p) for t, p in wanted.items()}))
        .option("startingOffsets", json.dumps(first))
        .option("endingOffsets", offsets_json(wanted))
        # compaction deletes offsets inside a range: that is expected, not data loss
        .option("failOnDataLoss", "false")
        .option("includeHeaders", str(headers).lower())
        .load()
    )


class TopicWatermarks:
    """Low/high watermarks of topics, through one long-lived consumer (cheap to ask every micro-batch).

    Args:
        kafka: the pipeline's Kafka config.
        timeout_s: how long one metadata or watermark request may take, seconds.
    """

    def __init__(self, kafka: KafkaConfig, timeout_s: float | None = None):
        from kernel.kafka import clients

        self.timeout_s = timeout_s or kafka.request_timeout_s
        self._kafka = kafka
        self._admin: Any = None
        self._ids: dict[str, str] = {}  # topic -> its Kafka topic id when first asked (topic_ids)
        # read_committed: the end offsets are the last stable offsets, what a read_committed read can reach
        self._consumer = clients.kafka_consumer(
            kafka, f"threes-stream-watermarks-{uuid.uuid4().hex}", isolation_level="read_committed"
        )
        self._partitions: dict[str, tuple[float, list[int]]] = {}

    def partitions(self, topic: str, max_age_s: float = 30.0) -> list[int]:
        """The partitions of ``topic`` (metadata asked again after ``max_age_s`` seconds: partitions may be added).

        A topic whose id was asked (:meth:`topic_ids`) is checked to be the same topic at each refresh.

        Raises:
            SetupError: the topic does not exist or Kafka did not answer.
            FatalError: the topic was deleted, or deleted and created again, since it was first seen.
        """
        known = self._partitions.get(topic)
        if known is None or time.monotonic() - known[0] > max_age_s:
            from confluent_kafka import KafkaError, KafkaException

            try:
                meta = self._consumer.list_topics(topic, timeout=self.timeout_s).topics.get(topic)
            except KafkaException as exc:
                raise SetupError(f"Kafka did not answer metadata for topic {topic!r}: {exc}") from exc
            if meta is None or meta.error is not None or not meta.partitions:
                gone = meta is None or meta.error is not None and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                if known is not None and gone:
                    raise FatalError(f"topic {topic!r} was deleted while the job ran; restart the job once it exists "
                                     "again (its snapshot would otherwise answer from the deleted topic's records)")
                raise SetupError(
                    f"topic {topic!r} does not exist",
                    "create it (the source connector creates its compacted topic) or fix the topic name",
                )
            if topic in self._ids:
                now = self._topic_id(topic)
                if now != self._ids[topic]:
                    raise FatalError(
                        f"topic {topic!r} was deleted and created again while the job ran (topic id "
                        f"{self._ids[topic]}, now {now}); restart the job: it reads the new topic from its beginning "
                        "(its snapshot would otherwise mix the two topics' records)"
                    )
            known = (time.monotonic(), sorted(meta.partitions))
            self._partitions[topic] = known
        return known[1]

    def topic_ids(self, topics: Iterable[str]) -> dict[str, str]:
        """Kafka's id of each topic (KIP-516): a topic deleted and created again has a new one.

        The first id seen is kept, and :meth:`partitions` checks it at each metadata refresh.

        Returns:
            Topic -> id (22 characters, base64).

        Raises:
            SetupError: a topic does not exist, or Kafka did not answer.
        """
        for topic in topics:
            if topic not in self._ids:
                self._ids[topic] = self._topic_id(topic)
        return {t: self._ids[t] for t in topics}

    def _topic_id(self, topic: str) -> str:
        from confluent_kafka import KafkaError, KafkaException, TopicCollection

        from kernel.kafka import clients

        if self._admin is None:
            self._admin = clients.kafka_admin(self._kafka)
        try:
            futures = self._admin.describe_topics(TopicCollection([topic]), request_timeout=self.timeout_s)
            description = futures[topic].result(self.timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise SetupError(f"topic {topic!r} does not exist", "create it or fix the topic name") from exc
            raise SetupError(f"Kafka did not describe topic {topic!r}: {exc}") from exc
        return str(description.topic_id)

    def _marks(self, topics: Iterable[str], which: int) -> Offsets:
        from kernel.kafka.topics import watermark_offsets

        out: Offsets = {}
        for topic in topics:
            out[topic] = {}
            for partition in self.partitions(topic):  # a leader moving is waited out up to the timeout
                try:
                    out[topic][partition] = watermark_offsets(self._consumer, topic, partition, self.timeout_s)[which]
                except SetupError:
                    self.partitions(topic, max_age_s=0)  # a topic deleted (or created again) says so
                    raise
        return out

    def end_offsets(self, topics: Iterable[str]) -> Offsets:
        """High watermarks: the next offset to be written, per partition."""
        return self._marks(topics, 1)

    def start_offsets(self, topics: Iterable[str]) -> Offsets:
        """Low watermarks: the first offset still stored, per partition."""
        return self._marks(topics, 0)

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()


class RangeReader:
    """Reads small offset ranges on the driver with one long-lived consumer (raw bytes, not decoded).

    A Spark batch read of a few hundred records costs a job and fresh Kafka
    consumers in the executors, most of a second; a snapshot refresh between
    micro-batches usually has a few records to read. Decoding still happens
    in the JVM (the bytes become a DataFrame).

    Args:
        kafka: the pipeline's Kafka config.
        timeout_s: the longest wait for records known to exist, seconds.
    """

    def __init__(self, kafka: KafkaConfig, timeout_s: float = 30.0):
        from kernel.kafka import clients

        self.timeout_s = timeout_s
        self._consumer = clients.kafka_consumer(
            kafka, f"threes-stream-ranges-{uuid.uuid4().hex}", isolation_level="read_committed"
        )

    def read(self, start: Offsets, end: Offsets) -> Any:
        """The records in ``[start, end)`` (a missing start partition reads from its beginning).

        Returns:
            A ``pyarrow.Table``: ``key, value`` (binary), ``topic`` (string),
            ``partition`` (int32), ``offset`` (int64).

        Raises:
            SetupError: the end offsets were not reached within ``timeout_s``.
        """
        import pyarrow as pa
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        wanted = {
            (t, p): (start.get(t, {}).get(p, OFFSET_BEGINNING), stop)
            for t, parts in end.items()
            for p, stop in parts.items()
            if start.get(t, {}).get(p, 0) < stop
        }
        cols: dict[str, list[Any]] = {"key": [], "value": [], "topic": [], "partition": [], "offset": []}
        if wanted:
            self._consumer.assign([TopicPartition(t, p, first) for (t, p), (first, _) in wanted.items()])
            pending = dict(wanted)
            left = sum(stop - max(first, 0) for first, stop in wanted.values())  # at most, after compaction
            deadline = time.monotonic() + self.timeout_s
            try:
                while pending:
                    if time.monotonic() > deadline:
                        raise SetupError(f"could not read offsets up to {offsets_json(end)} within {self.timeout_s} s")
                    # consume() returns early only once it has num_messages: ask for what can still come
                    for msg in self._consumer.consume(num_messages=max(1, min(10_000, left)), timeout=0.1):
                        if msg.error():
                            continue
                        left -= 1
                        tp = (msg.topic(), msg.partition())
                        if tp not in pending or msg.offset() >= pending[tp][1]:
                            continue
                        cols["key"].append(msg.key())
                        cols["value"].append(msg.value())
                        cols["topic"].append(tp[0])
                        cols["partition"].append(tp[1])
                        cols["offset"].append(msg.offset())
                    # compaction leaves gaps: a partition is done when its position reached the end offset
                    positions = self._consumer.position([TopicPartition(t, p) for t, p in pending])
                    for tp in positions:
                        if tp.offset >= pending[(tp.topic, tp.partition)][1]:
                            pending.pop((tp.topic, tp.partition))
            finally:
                self._consumer.unassign()
        return pa.table(
            {
                "key": pa.array(cols["key"], pa.binary()),
                "value": pa.array(cols["value"], pa.binary()),
                "topic": pa.array(cols["topic"], pa.string()),
                "partition": pa.array(cols["partition"], pa.int32()),
                "offset": pa.array(cols["offset"], pa.int64()),
            }
        )

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()

