"""Real-time mode (``stream.mode: realtime``): what it can run, and snapshot lookups in the JVM.

Spark 4.1+ runs a streaming query in **real-time mode** (``trigger(realTime=...)``): one long-running
batch per checkpoint interval whose tasks process each record as it arrives, instead of a micro-batch
per trigger. Its operator allow-list (Spark 4.2) takes projections, filters, unions, JVM UDFs and
broadcast-hash joins, and the Kafka, foreach, console and memory sinks, in ``update`` output mode; no
Python operator (no pandas UDF, no ``foreachBatch``) and no stateful aggregation. A broadcast side is
rebuilt only at checkpoint boundaries, so the job's snapshots cannot be broadcast DataFrames there.

The lookups run instead in a small Java component shipped with the package
(``stream_app/jars/threes-lookup.jar``, built by ``make jvm`` from ``stream_app/jvm``): on every
executor JVM, the snapshot's state store (``threes.store.SnapshotStore``), filled by a daemon Kafka
consumer that tails the compacted topics (what Kafka Streams' global stream thread does, KIP-99),
persisted and versioned in RocksDB, read by Spark UDFs (key body -> value body; key body and time ->
the version's value body). Its semantics:

* **Readiness gate.** The first lookup in an executor waits until its store has read every topic to
  the end offsets it saw when it started.
* **Eventually fresh**, like a GlobalKTable: a reference update is visible once the executor's
  consumer applied it (tens of milliseconds), with no ordering against the events; a tombstone
  deletes the key.
* **Heap, then disk.** The latest values are also held in the heap while they fit
  ``stream.snapshots[].max_bytes`` per snapshot per executor JVM (key and value bodies plus 112 bytes
  per key); a snapshot that needs more is served from RocksDB alone, on the executor's disk.
* **Versions.** With ``retention``, every record is also a version of its key from its source time,
  and an ``as_of`` lookup reads the version valid at the event's time (KIP-889).
* **Persistent.** Beside a local checkpoint, each store keeps its RocksDB folder and the offsets it
  covers; a restarted JVM reads only the topics' tail.

This module holds the checks (:func:`realtime_problems`, reported by ``threes validate``), the jar
(:func:`lookup_jar`) and the lookup column (:func:`lookup_column`); no side effect but registering
a UDF in a session.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path
from typing import Any

from kernel.exceptions import SetupError
from stream_app.config import StreamJobConfig
from stream_app.durations import duration_s
from stream_app.snapshot_config import SnapshotConfig

log = logging.getLogger(__name__)

LOOKUP_JAR = "threes-lookup.jar"
LOOKUP_UDF_CLASS = "threes.lookup.LookupUdf"
READY_TIMEOUT_MS = 600_000
"""How long the first lookup of an executor waits for its store's first load, milliseconds."""


def realtime_problems(config: StreamJobConfig) -> list[tuple[str, str]]:
    """What a ``stream.mode: realtime`` config asks that Spark 4.2's real-time mode cannot run.

    Args:
        config: the ``stream:`` section.

    Returns:
        ``(path under stream, message)`` per problem, each naming the reason; empty for a
        micro-batch config.
    """
    if config.mode != "realtime":
        return []
    problems = [*_operator_problems(config), *_store_problems(config)]
    if config.events.value_format == "confluent_avro":
        problems.append(
            (
                "events.value_format",
                "confluent_avro events are read in stream.mode: microbatch only (the real-time query is planned "
                "once, before the registry's later schema ids could be known)",
            )
        )
    return problems


def _operator_problems(config: StreamJobConfig) -> list[tuple[str, str]]:
    """The query's operators real-time mode refuses: stateful aggregations, Python, a bound per micro-batch."""
    problems: list[tuple[str, str]] = []
    for j, update in enumerate(config.updates):
        if update.kind == "aggregation":
            problems.append(
                (
                    f"updates[{j}].kind",
                    "aggregation cannot run in real-time mode on Spark 4.2 (it allows no stateful aggregation); "
                    "use stream.mode: microbatch, or a second job in micro-batch mode reading the enriched topic",
                )
            )
    if config.transform is not None:
        problems.append(
            (
                "transform",
                "a Python transform function cannot run in real-time mode on Spark 4.2 (no Python operator is "
                "allowed there); say it with where/derive expressions, or use stream.mode: microbatch",
            )
        )
    if config.events.max_offsets_per_trigger is not None:
        problems.append(
            (
                "events.max_offsets_per_trigger",
                "real-time mode has no micro-batches to bound: each event is processed as it arrives",
            )
        )
    return problems


def _store_problems(config: StreamJobConfig) -> list[tuple[str, str]]:
    """What the executors' JVM store cannot read: the Python index, non-single-object records, envelopes."""
    problems: list[tuple[str, str]] = []
    for i, snap in enumerate(config.snapshots):
        if snap.index_min_rows is not None:
            problems.append(
                (
                    f"snapshots[{i}].index_min_rows",
                    "the indexed engine runs in Python workers, which real-time mode does not allow; its lookups "
                    "run in the JVM (bounded by max_bytes)",
                )
            )
        # the JVM store (stream_app/jvm) reads keys and values in single-object form only
        for field in ("key_format", "value_format"):
            if getattr(snap, field) in ("confluent_avro", "connect_json"):
                problems.append(
                    (
                        f"snapshots[{i}].{field}",
                        f"{getattr(snap, field)}: real-time mode's JVM store reads Avro single-object records only; "
                        "use stream.mode: microbatch for a snapshot in the registry's or Kafka Connect's format",
                    )
                )
        if snap.envelope != "none":
            problems.append(
                (
                    f"snapshots[{i}].envelope",
                    "real-time mode's JVM store keeps each record's value as it is: a Debezium envelope (after, "
                    "deletes, TOASTed columns) is read in stream.mode: microbatch only",
                )
            )
    return problems


def checkpoint_interval_s(config: StreamJobConfig) -> int:
    """The real-time query's checkpoint interval, seconds (``stream.checkpoint_interval``)."""
    return duration_s(config.checkpoint_interval)


def lookup_jar() -> Path:
    """The Java lookup component's jar, shipped in this package.

    Raises:
        SetupError: it was not built (a source checkout before ``make jvm``).
    """
    path = Path(str(resources.files("stream_app").joinpath("jars", LOOKUP_JAR)))
    if not path.is_file():
        raise SetupError(
            f"stream.mode realtime needs {path}, the Java lookup component: build it with `make jvm` "
            "(Maven and a JDK 17)"
        )
    return path


def consumer_properties(librdkafka: dict[str, Any]) -> str:
    """Java Kafka consumer settings (``java.util.Properties`` text) from the pipeline's librdkafka settings.

    Only the connection is carried over: bootstrap servers and, when set, the security protocol, the
    SASL mechanism with a JAAS line for its user, and the CA file (``ssl.ca.location``) as a PEM trust
    store (Kafka's ``ssl.truststore.type=PEM``, KIP-651), which must be at the same path on every
    executor host.

    Args:
        librdkafka: :meth:`kernel.config.models.KafkaConfig.librdkafka_config`.

    Returns:
        ``key=value`` lines.
    """
    out = {"bootstrap.servers": librdkafka["bootstrap.servers"], "client.id": "threes-realtime-snapshot"}
    if "security.protocol" in librdkafka:
        out["security.protocol"] = str(librdkafka["security.protocol"]).upper()
    if "sasl.mechanism" in librdkafka or "sasl.mechanisms" in librdkafka:
        mechanism = str(librdkafka.get("sasl.mechanism") or librdkafka["sasl.mechanisms"]).upper()
        out["sasl.mechanism"] = mechanism
        module = (
            "org.apache.kafka.common.security.plain.PlainLoginModule"
            if mechanism == "PLAIN"
            else "org.apache.kafka.common.security.scram.ScramLoginModule"
        )
        user, password = (_jaas_quoted(librdkafka.get(k, "")) for k in ("sasl.username", "sasl.password"))
        out["sasl.jaas.config"] = f'{module} required username="{user}" password="{password}";'
    if "ssl.ca.location" in librdkafka:
        out["ssl.truststore.type"] = "PEM"
        out["ssl.truststore.location"] = str(librdkafka["ssl.ca.location"])
    # Properties text: escape what Properties.load reads specially
    return "\n".join(f"{k}={_escape(v)}" for k, v in out.items()) + "\n"


def _jaas_quoted(value: Any) -> str:
    """A JAAS option value inside double quotes: Kafka's JaasConfig tokenizer unescapes backslash escapes."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"')


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")


def register_lookup(
    spark: Any,
    udf_name: str,
    snapshot: SnapshotConfig,
    key_schema_json: str | None,
    value_schema_json: str,
    consumer_config: str,
    schema_topic: str,
    start_offsets: dict[tuple[str, int], int] | None = None,
    state_dir: str | None = None,
    in_driver: bool = False,
) -> str:
    """Register the lookup UDFs of one snapshot in ``spark``.

    ``udf_name`` (``binary -> binary``), and for a versioned snapshot ``<udf_name>_as_of`` (``binary,
    bigint -> binary``: key body, epoch ms).

    Args:
        spark: a SparkSession whose ``spark.jars`` hold :func:`lookup_jar`.
        udf_name: the SQL function name, e.g. ``threes_lookup_airports``.
        snapshot: the snapshot's config (name, topics, ``max_bytes``, ``retention``).
        key_schema_json: the reader key schema; ``None`` for ``key_format: string``.
        value_schema_json: the reader value schema.
        consumer_config: :func:`consumer_properties`.
        schema_topic: the topic of the writer schemas.
        start_offsets: ``(topic, partition) -> offset`` to start each store from (``None``: the beginning).
        state_dir: a local folder (the same path on every executor host) under which each store keeps
            its RocksDB folder and the offsets it covers, checkpointed every 30 s and when it closes; a
            restarted JVM reads only the topics' tail. ``None``: a temporary folder, and every start
            reads the topics from their beginning.
        in_driver: also start the store in the driver's JVM now (the job serves queries from it; in
            ``local[*]`` it is the executors' store, loading before the first event).

    Returns:
        the store's id in this JVM (``<snapshot>@<hash of the spec>``, the key of :func:`store_status`):
        two jobs' snapshots of one name in one JVM are two stores.
    """
    jvm = spark.sparkContext._jvm
    spec = jvm.threes.store.StoreSpec(
        snapshot.name,
        consumer_config,
        ",".join(snapshot.topics),
        schema_topic,
        key_schema_json,
        value_schema_json,
        snapshot.max_bytes,
        READY_TIMEOUT_MS,
        ",".join(f"{t}:{p}={o}" for (t, p), o in sorted((start_offsets or {}).items())),
        state_dir,
        -1 if snapshot.retention_ms is None else snapshot.retention_ms,
    )
    binary = jvm.org.apache.spark.sql.types.DataTypes.BinaryType
    spark._jsparkSession.udf().register(udf_name, jvm.threes.lookup.LookupUdf(spec), binary)
    if snapshot.retention_ms is not None:
        spark._jsparkSession.udf().register(f"{udf_name}_as_of", jvm.threes.lookup.AsOfLookupUdf(spec), binary)
    if in_driver:
        jvm.threes.store.SnapshotStore.forSpec(spec)
    log.info("snapshot=%s lookup udf=%s topics=%s max_bytes=%d retention_ms=%s", snapshot.name, udf_name,
             snapshot.topics, snapshot.max_bytes, snapshot.retention_ms)
    return str(spec.storeId())


def register_event_decoder(
    spark: Any, udf_name: str, reader_schema_json: str, consumer_config: str, schema_topic: str
) -> tuple[str, str]:
    """Register the events' decode step of a real-time query in ``spark``: two JVM UDFs.

    A micro-batch query learns writer schemas registered after it started between micro-batches; a
    real-time query cannot, so its events are decoded in the JVM (``threes.lookup.EventDecoder``),
    which reads the schema topic again on the first record of a writer it has not seen, as a
    registry-backed Kafka deserializer does: a producer that registers a new writer schema after the
    query started is read, not dead-lettered.

    Args:
        spark: a SparkSession whose ``spark.jars`` hold :func:`lookup_jar`.
        udf_name: the decode function's SQL name; the reason function is ``<udf_name>_error``.
        reader_schema_json: the events' reader schema (``stream.events.value_schema``).
        consumer_config: :func:`consumer_properties`.
        schema_topic: the topic of the writer schemas.

    Returns:
        ``(decode, error)``: the names of ``binary -> binary`` (single-object record -> bare body of
        the reader schema, null when it does not decode) and ``binary -> string`` (the dead letter's
        reason, null when it decodes).
    """
    jvm = spark.sparkContext._jvm
    types = jvm.org.apache.spark.sql.types.DataTypes
    names = (udf_name, f"{udf_name}_error")
    for name, reasons, result in zip(names, (False, True), (types.BinaryType, types.StringType), strict=True):
        udf = jvm.threes.lookup.EventDecodeUdf(schema_topic, consumer_config, reader_schema_json, reasons)
        spark._jsparkSession.udf().register(name, udf, result)
    return names


def lookup_column(
    udf_name: str, key: Any, key_schema_json: str | None, value_schema_json: str, at_ms: Any = None
) -> Any:
    """The snapshot value of each event's key, as a struct column (null when the snapshot has no such key).

    Args:
        udf_name: from :func:`register_lookup`.
        key: the event's lookup key: a struct column of the key schema's fields, cast to its types
            (:func:`stream_app.snapshot.data.event_lookup_key` builds one), or a string column for
            ``key_format: string``.
        key_schema_json: the reader key schema; ``None`` for ``key_format: string``.
        value_schema_json: the reader value schema.
        at_ms: an ``as_of`` lookup's time column (epoch ms, long): the version valid then, through
            ``<udf_name>_as_of``; ``None``: the latest value.

    Returns:
        A struct column of the value schema; every stage is a Catalyst expression or the JVM UDF.
    """
    from pyspark.sql import functions as f
    from pyspark.sql.avro.functions import from_avro, to_avro

    body = key.cast("binary") if key_schema_json is None else to_avro(key, key_schema_json)
    found = f.call_function(udf_name, body) if at_ms is None else f.call_function(f"{udf_name}_as_of", body, at_ms)
    return from_avro(found, value_schema_json)


def serve_queries(spark: Any, store_ids: list[str], host: str, port: int, token: str | None) -> Any:
    """Serve interactive queries of the driver's stores from the JVM (``threes.store.QueryServer``).

    Args:
        spark: the job's session.
        store_ids: the stores to serve (:func:`register_lookup`'s ids, started with ``in_driver``).
        host: the address to bind.
        port: the port (0: any free one).
        token: the bearer token every request but ``/healthz`` and ``/readyz`` must carry; ``None``: none.

    Returns:
        the server (``.port()``, ``.close()``).
    """
    jvm = spark.sparkContext._jvm
    ids = jvm.java.util.ArrayList()
    for store_id in store_ids:
        ids.add(store_id)
    return jvm.threes.store.QueryServer.forStores(host, port, token, 16, ids)


def close_stores(spark: Any) -> None:
    """Close the stores of the driver's JVM (in ``local[*]`` the executors'), each checkpointing its RocksDB folder."""
    spark.sparkContext._jvm.threes.store.SnapshotStore.closeAll()


def store_status(spark: Any) -> dict[str, dict[str, Any]]:
    """The stores of the driver's JVM (in ``local[*]`` the executors' too), for status and metrics.

    Returns:
        ``{snapshot spec id: {keys, engine, bytes, max_bytes, disk_bytes, applied, tombstones, bad_records,
        ready, ready_ms, last_applied_timestamp_ms, restored_keys}}``: ``engine`` ``heap`` (the latest values
        in the heap too) or ``rocksdb``; ``bytes`` the heap they take; ``restored_keys`` RocksDB's estimate
        of the keys found in the state folder at start (-1: started empty).
    """
    jvm = spark.sparkContext._jvm
    out: dict[str, dict[str, Any]] = {}
    stores = jvm.threes.store.SnapshotStore.stores()
    for store_id in list(stores.keySet().toArray()):
        store = stores.get(store_id)
        out[str(store_id)] = {
            "keys": store.keys(),
            "engine": str(store.engine()),
            "bytes": store.heapBytes(),
            "max_bytes": store.spec().maxBytes(),
            "disk_bytes": store.diskBytes(),
            "applied": store.applied(),
            "tombstones": store.tombstones(),
            "bad_records": store.badRecords(),
            "ready": store.isReady(),
            "ready_ms": store.readyMs(),
            "last_applied_timestamp_ms": store.lastAppliedTimestampMs(),
            "restored_keys": store.restoredKeys(),
        }
    return out
