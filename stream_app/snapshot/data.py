"""The snapshot as data: pure functions from compacted-topic records to the latest value per key.

A snapshot is the latest value per key of one or more compacted topics, a
record with a ``null`` value (tombstone) removing its key, exactly as log
compaction would (Kafka documentation, "Log Compaction"; Kafka Streams'
GlobalKTable). Its rows carry two internal columns beside the value fields:

* ``__lk`` (string): the *lookup key*, rendered from the decoded key fields by
  :func:`lookup_key` the same way on the event side, so a foreign key and a
  snapshot key meet on equal strings whatever their Avro writer schema.
* ``__lh`` (long): ``xxhash64(__lk)``, the hash the broadcast lookup indexes
  (:mod:`stream_app.snapshot.indexed`), which checks ``__lk`` on every hit.

Nothing here has side effects: the Spark functions take and return
DataFrames, the Arrow ones take and return tables, so unit tests call them on
small frames. The live snapshot (reading Kafka, broadcasting, checkpointing)
is :mod:`stream_app.snapshot.runtime`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger(__name__)

LK, LH = "__lk", "__lh"
DELETED, TOPIC, PARTITION, OFFSET, RANK, ERROR = "__deleted", "__topic", "__partition", "__offset", "__rank", "__error"
LOG_COLUMNS = (LK, LH, DELETED, TOPIC, PARTITION, OFFSET)
"""Columns of an overlay log row before the value fields."""


def _f() -> Any:
    from pyspark.sql import functions

    return functions


def lookup_key(key: Any, key_type: Any) -> Any:
    """The lookup key (string column) of a struct column holding the key fields.

    A single string or integral key field is used as its string; anything else
    (composite keys, other types) is rendered with ``to_json``, whose output is
    fixed by the struct's field names and types. Both sides call this on a
    struct of the snapshot key's field names and types, so equal keys give
    equal strings. ``null`` when any key field is null (matches nothing).

    Args:
        key: a struct column with the key fields, in key schema order.
        key_type: its :class:`pyspark.sql.types.StructType`.
    """
    from pyspark.sql import types as T

    f = _f()
    fields = key_type.fields
    if len(fields) == 1 and isinstance(
        fields[0].dataType, T.StringType | T.IntegerType | T.LongType | T.ShortType | T.ByteType
    ):
        return key[fields[0].name].cast("string")
    present = f.lit(True)
    for fld in fields:
        present = present & key[fld.name].isNotNull()
    return f.when(present, f.to_json(key))


def event_lookup_key(on: Mapping[str, str], key_type: Any) -> Any:
    """The lookup key of events for a lookup ``on`` (event field -> snapshot key field).

    Event fields are cast to the key fields' types and named like them, so a
    foreign key meets the snapshot key whatever its own name and integer width.

    Raises:
        ValueError: ``on`` does not name every key field exactly once.
    """
    f = _f()
    by_key = {k: e for e, k in on.items()}
    names = [fld.name for fld in key_type.fields]
    if sorted(by_key) != sorted(names) or len(by_key) != len(on):
        raise ValueError(f"lookup must map every snapshot key field {names} exactly once, got {dict(on)}")
    key = f.struct(*[f.col(by_key[fld.name]).cast(fld.dataType).alias(fld.name) for fld in key_type.fields])
    return lookup_key(key, key_type)


def corrupt_to_null(decoded: Any, reader_schema_json: str) -> Any:
    """``null`` where a PERMISSIVE ``from_avro`` hid a corrupt body behind a struct of nulls.

    Spark's ``from_avro`` in PERMISSIVE mode returns, for a record struct, a
    row whose fields are all null rather than a null struct when the body does
    not decode. Such a row is told apart by a null in a field the reader schema
    requires (not a union with ``null``); when no field is required, a corrupt
    body cannot be told from a record of nulls and passes as one.

    Args:
        decoded: the struct column ``from_avro``/``decode_avro`` gave (use it
            from a previous projection: it is referenced twice).
        reader_schema_json: the reader schema.
    """
    import json

    from stream_app.avro_schemas import is_optional

    f = _f()
    required = [fld["name"] for fld in json.loads(reader_schema_json)["fields"] if not is_optional(fld["type"])]
    if not required:
        return decoded
    missing = f.lit(True)
    for name in required:
        missing = missing & decoded[name].isNull()
    return f.when(decoded.isNotNull() & ~missing, decoded)


def record_decoder(
    writers: Mapping[bytes, str],
    key_schema_json: str,
    value_schema_json: str,
    key_type: Any,
    topic_rank: Mapping[str, int],
    key_format: str = "avro",
    carry: Sequence[str] = (),
    formats: RecordFormats | None = None,
) -> Any:
    """The decoding of compacted-topic records as a function of Spark's Kafka rows (columns built once).

    Building the columns is most of the cost of decoding a few records (each
    is a call into the JVM), so callers keep the decoder while the writer
    schemas stay the same.

    Args:
        writers: known writer schemas, fingerprint -> JSON.
        key_schema_json: reader schema of the keys.
        value_schema_json: reader schema of the values.
        key_type: Spark type of the decoded key.
        topic_rank: topic -> position in the snapshot's topic list.
        key_format: ``avro`` (single-object keys, read with ``key_schema_json``),
            ``confluent_avro`` (the same through ``formats.headers``), ``connect_json``
            (Kafka Connect JSON, :func:`connect_json_column`) or ``string``: plain
            UTF-8 keys (Kafka Streams' ``Serdes.String()``),
            taken as the one string field of ``key_type`` by Spark's binary to
            string cast (invalid UTF-8 becomes U+FFFD, as in Java's ``String``).
        carry: more columns of the raw rows kept as they are, last (the versioned
            store's record time, :mod:`stream_app.snapshot.versioned`).
        formats: how values (and keys other than ``avro``/``string``) are framed: the
            registry's Confluent prefixes, Kafka Connect JSON, a Debezium envelope;
            ``None``: single-object Avro values.

    Returns:
        ``decode(raw) -> DataFrame``, see :func:`decode_records`.
    """
    from stream_app.avro import decode_avro, from_confluent

    f = _f()
    formats = formats or RecordFormats()
    key_in = from_confluent(f.col("key"), formats.headers) if key_format == "confluent_avro" else f.col("key")
    value_in = from_confluent(f.col("value"), formats.headers) if formats.value_format == "confluent_avro" else (
        f.col("value"))
    if key_format == "string":
        name = key_type.fields[0].name
        key = f.when(f.col("key").isNotNull(), f.struct(f.col("key").cast("string").alias(name)))
    elif key_format == "connect_json":
        key = connect_json_column(f.col("key"), key_type)
    else:
        key = decode_avro(key_in, writers, key_schema_json)
    # a Debezium value is decoded as its envelope (``__e``), whose ``after`` is the row
    envelope_json = formats.envelope_json if formats.debezium else None
    if formats.value_format == "connect_json":
        value = connect_json_column(f.col("value"), formats.value_type, envelope=formats.debezium)
    else:
        value = decode_avro(value_in, writers, envelope_json or value_schema_json)
    first = [
        "key",
        "value",
        f.col("topic").alias(TOPIC),
        f.col("partition").alias(PARTITION),
        f.col("offset").alias(OFFSET),
        key.alias("__k"),
        value.alias("__e" if formats.debezium else "__v"),
        *carry,
    ]
    if formats.debezium:
        # checked as the envelope (op is required); a delete's after is null
        env = f.col("__e")
        decoded_env = corrupt_to_null(env, envelope_json) if envelope_json else f.when(env["op"].isNotNull(), env)
        value_checks = [decoded_env.alias("__e")]
    else:
        value_checks = [corrupt_to_null(f.col("__v"), value_schema_json).alias("__v")]
    second = [
        "key",
        "value",
        TOPIC,
        PARTITION,
        OFFSET,
        corrupt_to_null(f.col("__k"), key_schema_json).alias("__k"),
        *value_checks,
        *carry,
    ]
    rank = f.lit(0)
    for topic, position in sorted(topic_rank.items(), key=lambda kv: kv[1]):
        rank = f.when(f.col(TOPIC) == topic, f.lit(position)).otherwise(rank)
    lk = lookup_key(f.col("__k"), key_type)
    decoded = f.col("__e") if formats.debezium else f.col("__v")

    def reason(col: Any, fmt: str, what: str) -> Any:
        if fmt == "connect_json":
            return f.lit(f"{what} is not Kafka Connect JSON (schemas.enable=true) of the reader schema")
        return decode_error_reason(col, writers, what)

    error = (
        f.when(f.col("key").isNull(), f.lit("record has no key"))
        .when(f.col("__k").isNull(), reason(key_in, key_format, "key"))
        .when(f.col("value").isNotNull() & decoded.isNull(), reason(value_in, formats.value_format, "value"))
    )
    deleted = f.col("value").isNull()
    if formats.debezium:
        deleted = deleted | (f.col("__e.op") == f.lit("d"))
    third = [
        lk.alias(LK),
        f.xxhash64(lk).alias(LH),
        deleted.alias(DELETED),
        TOPIC,
        PARTITION,
        OFFSET,
        rank.cast("int").alias(RANK),
        error.alias(ERROR),
        "key",
        "value",
        (f.col("__e.after") if formats.debezium else f.col("__v")).alias("__v"),
        *carry,
    ]

    def decode(raw: Any) -> Any:
        rows = raw.select(*first).select(*second)
        if formats.debezium:
            # op t (truncate) and m (message) change no key: not a record of the snapshot
            rows = rows.filter(f.col("__e").isNull() | ~f.col("__e.op").isin("t", "m"))
        return rows.select(*third)

    return decode


@dataclass(frozen=True)
class RecordFormats:
    """How a snapshot's records are framed, beside the writer schemas (``stream.snapshots[]``).

    Attributes:
        value_format: ``avro``, ``confluent_avro`` or ``connect_json``.
        headers: Confluent prefix -> single-object header of each registry writer schema
            (:func:`stream_app.avro.from_confluent`).
        debezium: values are Debezium change events (``envelope: debezium``).
        envelope_json: Avro formats with ``debezium``: the envelope reader schema
            (:func:`schemas.debezium.envelope_reader`).
        value_type: ``connect_json`` values: the Spark type of the row.
    """

    value_format: str = "avro"
    headers: Mapping[bytes, bytes] = field(default_factory=dict)
    debezium: bool = False
    envelope_json: str | None = None
    value_type: Any = None


def _connect_type(spark_type: Any) -> Any:
    """The Spark type ``from_json`` reads a Connect JSON field as (logical types as their encodings)."""
    from pyspark.sql import types as T

    if isinstance(spark_type, T.TimestampType | T.TimestampNTZType):
        return T.LongType()  # org.apache.kafka.connect.data.Timestamp: milliseconds since the epoch
    if isinstance(spark_type, T.DateType):
        return T.IntegerType()  # org.apache.kafka.connect.data.Date: days since the epoch
    if isinstance(spark_type, T.BinaryType):
        return T.StringType()  # base64
    if isinstance(spark_type, T.DecimalType):
        raise ValueError("Connect JSON decimals (base64 bytes, decimal.handling.mode=precise) are not read: use "
                         "decimal.handling.mode=double or string in the connector")
    return spark_type


def connect_json_column(col: Any, spark_type: Any, envelope: bool = False) -> Any:
    """Kafka Connect ``JsonConverter`` records (``schemas.enable=true``) as a struct of ``spark_type``.

    The ``payload`` is parsed by Spark's ``from_json``; Connect's logical types become Spark's:
    ``Timestamp`` (ms) a timestamp, ``Date`` (days) a date, ``bytes`` (base64) binary.

    Args:
        col: the binary key or value column.
        spark_type: the struct type of the key, or of the row.
        envelope: the payload is a Debezium envelope: the result is ``struct<after, op>``.

    Returns:
        A struct column; ``null`` for a null input or JSON without a payload.

    Raises:
        ValueError: a field type Connect JSON cannot be read as (decimals).
    """
    from pyspark.sql import types as T

    f = _f()
    row = T.StructType([T.StructField(fld.name, _connect_type(fld.dataType)) for fld in spark_type.fields])
    payload: Any = T.StructType([T.StructField("after", row), T.StructField("op", T.StringType())]) if envelope else row
    parsed = f.from_json(col.cast("string"), T.StructType([T.StructField("payload", payload)]))["payload"]

    def fields(struct: Any) -> Any:
        out = []
        for fld in spark_type.fields:
            value = struct[fld.name]
            if isinstance(fld.dataType, T.TimestampType | T.TimestampNTZType):
                value = f.timestamp_millis(value).cast(fld.dataType)
            elif isinstance(fld.dataType, T.DateType):
                value = f.date_from_unix_date(value)
            elif isinstance(fld.dataType, T.BinaryType):
                value = f.unbase64(value)
            out.append(value.alias(fld.name))
        return f.when(struct.isNotNull(), f.struct(*out))

    if envelope:
        return f.when(parsed.isNotNull(), f.struct(fields(parsed["after"]).alias("after"), parsed["op"].alias("op")))
    return fields(parsed)


def decode_records(
    raw: Any,
    writers: Mapping[bytes, str],
    key_schema_json: str,
    value_schema_json: str,
    key_type: Any,
    topic_rank: Mapping[str, int],
    key_format: str = "avro",
) -> Any:
    """Decode compacted-topic records (Spark's Kafka rows) in the JVM.

    Args:
        raw: Spark Kafka DataFrame (``key, value, topic, partition, offset``).
        writers: known writer schemas, fingerprint -> JSON.
        key_schema_json: reader schema of the keys.
        value_schema_json: reader schema of the values.
        key_type: Spark type of the decoded key.
        topic_rank: topic -> position in the snapshot's topic list.
        key_format: ``avro`` or ``string`` (see :func:`record_decoder`).

    Returns:
        ``__lk, __lh, __deleted, __topic, __partition, __offset, __rank,
        __error, key, value, __v`` where ``__v`` is the decoded value struct
        and ``__error`` the reason a record cannot be used (``null`` if it can).
    """
    return record_decoder(writers, key_schema_json, value_schema_json, key_type, topic_rank, key_format)(raw)


def decode_error_reason(col: Any, writers: Mapping[bytes, str], what: str) -> Any:
    """Why a single-object encoded column did not decode (for the dead letter headers)."""
    from stream_app.avro import confluent_id, fingerprint_hex

    f = _f()
    fp = fingerprint_hex(col)
    known = [f.lit(k.hex()) for k in writers]
    # a Confluent-framed record left as it was: its id is in none of the followed registry subjects
    registry_id = confluent_id(col)
    return (
        f.when(
            registry_id.isNotNull(),
            f.concat(f.lit(f"{what} has a schema registry id unknown in the topic's subject: "), registry_id),
        )
        .when(fp.isNull(), f.lit(f"{what} is not Avro single-object encoding (no C3 01 marker)"))
        .when(
            ~fp.isin(*known) if known else f.lit(True),
            f.concat(f.lit(f"{what} has an unknown writer schema fingerprint "), fp),
        )
        .otherwise(f.concat(f.lit(f"{what} does not decode with its writer schema "), fp))
    )


def latest_per_key(
    records: Any,
    value_columns: Sequence[str] | None = None,
    keep_deleted: bool = False,
    partitions: int | None = None,
    unavailable: Sequence[str] = (),
    unresolved: str = "null",
) -> Any:
    """The latest record per lookup key; tombstones remove their key.

    Order: topic rank, then partition, then offset (Kafka keeps a key in one
    partition, where offsets order its records). Records with ``__error`` set
    are ignored (they went to the dead letter topic; they are not deletes).

    The records are hash-partitioned by ``__lk`` into ``partitions`` and sorted
    once, by (bucket, ``__lk``, newest first), where the bucket is Spark's
    bucket id of ``__lk`` (``pmod(murmur3(__lk), partitions)``); the first row
    of each key wins (a window's ``row_number``). That one sort also satisfies
    a Parquet write bucketed and sorted by ``__lk`` into ``partitions``
    buckets, and the output stays partitioned and sorted by ``__lk``. (A
    ``max_by`` aggregation of a struct is a sort-based aggregation in Spark,
    which sorts every record twice, before and after the shuffle: measured 3x
    slower on 2M keys.)

    Args:
        records: output of :func:`decode_records`, or any frame with ``__lk``,
            ``__lh``, ``__deleted``, ``__rank``, ``__partition``, ``__offset``
            and the value (struct ``__v``, or flat ``value_columns``).
        value_columns: flat value columns; ``None`` expands struct ``__v``.
        keep_deleted: keep the tombstones (a change set to apply), else drop
            them (a snapshot).
        partitions: how many hash partitions of ``__lk``; ``None``:
            ``spark.sql.shuffle.partitions``.
        unavailable: Debezium snapshots: the value columns that may hold
            ``__debezium_unavailable_value`` (a TOASTed column an UPDATE left out):
            each takes the key's latest earlier value since its last delete
            (:func:`fill_unavailable` on the driver does the same to a change table).
        unresolved: what such a column becomes without an earlier value here:
            ``null`` (the records are the whole topic) or ``keep`` the placeholder
            (a delta: the snapshot holds the previous value, :func:`fill_unavailable`).

    Returns:
        ``__lk, __lh[, __deleted, __topic, __partition, __offset]`` and the value
        fields, one row per key.
    """
    from pyspark.sql import Window

    f = _f()
    # Records with an error are dropped after the window, which orders them last within their key: a
    # filter on ``__error`` here would be pushed by Spark below a decode it was not observed after, and
    # evaluate its ``from_avro`` once more per reference (measured 2-4x on a 10M-record bootstrap).
    with_errors = ERROR in records.columns
    if value_columns is None:
        records = records.select("*", "__v.*").drop("__v")
        value_columns = [c for c in records.columns if not c.startswith("__") and c not in ("key", "value")]
    if partitions is None:
        partitions = int(records.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    if unavailable:
        records = _carry_unavailable(records, unavailable, unresolved, with_errors)
    keep = [LH, DELETED, TOPIC, PARTITION, OFFSET, *value_columns]
    present = [c for c in keep if c in records.columns]
    order = [f.col(RANK).desc(), f.col(PARTITION).desc(), f.col(OFFSET).desc()]
    chosen = f.col("__n") == 1
    carried = present
    if with_errors:  # valid records first; a key whose records all have errors has no row
        order.insert(0, f.col(ERROR).isNull().desc())
        chosen = chosen & f.col(ERROR).isNull()
        carried = [*present, ERROR]
    newest_first = Window.partitionBy(bucket_id(LK, partitions), f.col(LK)).orderBy(*order)
    latest = (
        records.repartition(partitions, LK)
        .select(LK, *carried, f.row_number().over(newest_first).alias("__n"))
        .filter(chosen)
        .select(LK, *present)
    )
    if keep_deleted:
        return latest
    return latest.filter(~f.col(DELETED)).select(LK, LH, *value_columns)


def _carry_unavailable(records: Any, columns: Sequence[str], unresolved: str, with_errors: bool) -> Any:
    """Replace Debezium's placeholders by the key's latest earlier value (see :func:`latest_per_key`)."""
    from pyspark.sql import Window
    from pyspark.sql import types as T

    from schemas.debezium import UNAVAILABLE

    f = _f()
    order = [f.col(RANK), f.col(PARTITION), f.col(OFFSET)]
    upto = Window.partitionBy(LK).orderBy(*order).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    # a delete starts a new segment: no value is carried across it
    records = records.withColumn("__seg", f.sum(f.col(DELETED).cast("int")).over(upto))
    segment = Window.partitionBy(LK, "__seg").orderBy(*order).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    usable = ~f.col(DELETED) & (f.col(ERROR).isNull() if with_errors else f.lit(True))
    for name in columns:
        col, kind = f.col(name), records.schema[name].dataType
        if isinstance(kind, T.ArrayType):
            placeholder = (f.size(col) == 1) & (col[0].cast("string") == f.lit(UNAVAILABLE))
        elif isinstance(kind, T.BinaryType):
            placeholder = col == f.lit(UNAVAILABLE.encode())
        else:
            placeholder = col == f.lit(UNAVAILABLE)
        placeholder = f.coalesce(placeholder, f.lit(False))
        # wrapped in a struct: a real null is a value to carry, ignorenulls skips only the placeholders
        earlier = f.last(f.when(usable & ~placeholder, f.struct(col.alias("v"))), ignorenulls=True).over(segment)
        fallback = col if unresolved == "keep" else f.lit(None).cast(kind)
        records = records.withColumn(
            name, f.when(placeholder, f.when(earlier.isNotNull(), earlier["v"]).otherwise(fallback)).otherwise(col)
        )
    return records.drop("__seg")


def unavailable_columns(value_type: Any) -> list[str]:
    """The value columns that can hold Debezium's placeholder: strings, bytes, arrays."""
    from pyspark.sql import types as T

    return [fld.name for fld in value_type.fields
            if isinstance(fld.dataType, T.StringType | T.BinaryType | T.ArrayType)]


def bucket_id(column: str, buckets: int) -> Any:
    """Spark's bucket (and hash partition) of a column's value: ``pmod(murmur3(column), buckets)``."""
    f = _f()
    return f.pmod(f.hash(f.col(column)), f.lit(buckets))


# ---------------------------------------------------------------------------------------------
# Arrow: the broadcast base and the overlay of recent changes live on the driver as Arrow tables.


def dedupe_last(changes: pa.Table) -> pa.Table:
    """Keep the last row per ``__lk`` (table order = read order).

    Returns:
        The rows kept, in their original order.
    """
    if changes.num_rows == 0:
        return changes
    numbered = changes.append_column("__row", pa.array(range(changes.num_rows), pa.int64()))
    last = numbered.group_by(LK, use_threads=False).aggregate([("__row", "max")]).column("__row_max")
    return changes.take(np.sort(last.to_numpy()))


def apply_changes(base: pa.Table, changes: pa.Table) -> pa.Table:
    """Apply a change set (updates and tombstones) to a snapshot table.

    Args:
        base: ``__lk, __lh`` + value columns, one row per key.
        changes: the same columns plus ``__deleted``, one row per key
            (:func:`dedupe_last`); extra log columns are ignored.

    Returns:
        The base without the changed keys, then the changed keys that are not
        deleted: one row per key, the base's schema.
    """
    if changes.num_rows == 0:
        return base
    untouched = base.filter(pc.invert(pc.is_in(base.column(LK), value_set=changes.column(LK))))
    live = changes.filter(pc.invert(changes.column(DELETED))).select(base.column_names).cast(base.schema)
    return pa.concat_tables([untouched, live]).combine_chunks()


def below(log_table: pa.Table, upto: Mapping[str, Mapping[int, int]]) -> pa.Table:
    """The overlay log rows with an offset below ``upto`` for their topic-partition (replays)."""
    if log_table.num_rows == 0:
        return log_table
    keep = pa.array([False] * log_table.num_rows)
    for topic, parts in upto.items():
        for partition, end in parts.items():
            hit = pc.and_(
                pc.and_(pc.equal(log_table.column(TOPIC), topic), pc.equal(log_table.column(PARTITION), partition)),
                pc.less(log_table.column(OFFSET), end),
            )
            keep = pc.or_(keep, hit)
    return log_table.filter(keep)


def ipc_bytes(table: pa.Table) -> bytes:
    """Serialize a table as an Arrow IPC stream (what the broadcast and the overlay carry)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


@dataclass
class SnapshotView:
    """What one micro-batch joins against: a base and an overlay of newer changes, at known offsets.

    Attributes:
        name: the snapshot's name.
        key_type: Spark type of the key fields (the event side renders its
            lookup key against it).
        value_type: Spark type of the value fields (the joined columns).
        offsets: the next offset per topic-partition this view covers.
        mode: ``"broadcast"`` (base a small cached DataFrame, joined by Spark's
            broadcast hash join), ``"indexed"`` (base in an Arrow broadcast
            variable, looked up in the Python workers' cached index) or
            ``"partitioned"`` (base a cached DataFrame partitioned by ``__lk``,
            joined by Spark's shuffle join).
        base_rows: keys in the base.
        token: identity of the base (workers cache one index per token).
        broadcast: the Spark broadcast of the base as Arrow IPC bytes (indexed mode).
        base_df: the base as a cached DataFrame (broadcast and partitioned modes).
        overlay: changes newer than the base, one row per key, ``__lk, __lh,
            __deleted`` + value fields; a deleted row hides the base row.
        lookup_files: partitioned mode: the local folder of the version's
            lookup files (:mod:`stream_app.snapshot.mapped`), searched per event
            by the Python workers instead of a join; ``None``: Spark joins.
        partitions: partitioned mode: the base's buckets.
        versions: a versioned snapshot (``retention``): its versions as of this
            view (:class:`~stream_app.snapshot.versioned.VersionsView`), what
            ``as_of`` lookups join; ``None`` otherwise.
        jvm: ``"jvm"`` mode (real-time mode, :mod:`stream_app.realtime`): the lookup UDF's name and the
            reader key (``None`` for string keys) and value schema JSON; the table lives in the executors'
            JVMs, the view holds no data.
    """

    name: str
    key_type: Any
    value_type: Any
    offsets: dict[str, dict[int, int]]
    mode: str
    base_rows: int
    token: str = ""
    broadcast: Any = None
    base_df: Any = None
    overlay: pa.Table | None = None
    lookup_files: str | None = None
    partitions: int = 0
    versions: Any = None
    jvm: tuple[str, str | None, str] | None = None
    _overlay_ipc: bytes | None = field(default=None, repr=False)
    _overlay_df: Any = field(default=None, repr=False)

    @property
    def overlay_rows(self) -> int:
        """Rows in the overlay."""
        return 0 if self.overlay is None else self.overlay.num_rows

    def overlay_ipc(self) -> bytes | None:
        """The overlay as Arrow IPC bytes (shipped with the lookup function), ``None`` when empty."""
        if self.overlay is not None and self.overlay_rows and self._overlay_ipc is None:
            self._overlay_ipc = ipc_bytes(self.overlay.select([LK, LH, DELETED, *self.value_type.fieldNames()]))
        return self._overlay_ipc

    def overlay_df(self, spark: Any) -> Any:
        """The overlay as a small DataFrame (Spark joins it by broadcast), ``None`` when empty."""
        if self.overlay is not None and self.overlay_rows and self._overlay_df is None:
            self._overlay_df = spark.createDataFrame(self.overlay.select([LK, DELETED, *self.value_type.fieldNames()]))
        return self._overlay_df

    @classmethod
    def from_dataframe(
        cls, spark: Any, name: str, rows: Any, key_fields: Sequence[str], mode: str = "broadcast"
    ) -> SnapshotView:
        """A view over a DataFrame of live rows (key fields + value fields), no overlay.

        For tests and one-off use: the runtime builds views from Kafka.

        Args:
            spark: the SparkSession.
            name: the snapshot's name.
            rows: one row per key, with the key fields and the value fields.
            key_fields: the key field names, in key order.
            mode: ``"broadcast"``, ``"indexed"`` or ``"partitioned"``.
        """
        import uuid

        from pyspark.sql import types as T

        f = _f()
        key_type = T.StructType([rows.schema[k] for k in key_fields])
        value_type = T.StructType([fld for fld in rows.schema.fields if fld.name not in key_fields])
        lk = lookup_key(f.struct(*key_fields), key_type)
        table = rows.select(lk.alias(LK), f.xxhash64(lk).alias(LH), *value_type.fieldNames())
        if mode == "indexed":
            arrow = table.toArrow()
            return cls(
                name,
                key_type,
                value_type,
                {},
                mode,
                arrow.num_rows,
                uuid.uuid4().hex,
                broadcast=spark.sparkContext.broadcast(ipc_bytes(arrow)),
            )
        if mode == "partitioned":
            table = table.repartition(int(spark.conf.get("spark.sql.shuffle.partitions")), LK).sortWithinPartitions(LK)
        base = table.cache()
        return cls(name, key_type, value_type, {}, mode, base.count(), base_df=base)


def _nullable_type(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(kind):
        return pa.struct([_nullable_field(kind.field(i)) for i in range(kind.num_fields)])
    if pa.types.is_map(kind):  # a map's keys are never null in Arrow
        return pa.map_(kind.key_field.with_type(_nullable_type(kind.key_type)), _nullable_field(kind.item_field))
    if pa.types.is_large_list(kind):
        return pa.large_list(_nullable_field(kind.value_field))
    if pa.types.is_list(kind):
        return pa.list_(_nullable_field(kind.value_field))
    return kind


def _nullable_field(fld: pa.Field) -> pa.Field:
    return fld.with_nullable(True).with_type(_nullable_type(fld.type))


def arrow_schema(spark_type: Any) -> pa.Schema:
    """The Arrow schema of a Spark ``StructType``, timestamps as UTC instants (``spark.sql.session.timeZone``).

    pyspark 4.2 names the zone (``timezone="UTC"``); pyspark 4.0 had ``timestamp_utc=True``, its
    default (``benchmarks/spark_versions.py`` runs the job on both).
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(spark_type, timezone="UTC")
    except TypeError:  # pyspark before 4.1
        return to_arrow_schema(spark_type)


def nullable_schema(schema: pa.Schema) -> pa.Schema:
    """The same schema with every field nullable, nested ones too (map keys excepted)."""
    return pa.schema([_nullable_field(fld) for fld in schema])


def nullable_table(table: pa.Table) -> pa.Table:
    """The same table with every field nullable, nested ones too.

    Tables from different Spark plans and from the driver's decoder then
    concatenate, and a cast never meets a child of a null struct marked
    non-nullable.
    """
    schema = nullable_schema(table.schema)
    return table if table.schema.equals(schema) else table.cast(schema)


def _unavailable_mask(column: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """Where a column holds Debezium's unavailable-value placeholder; ``None`` for a type that cannot."""
    from schemas.debezium import UNAVAILABLE

    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pc.fill_null(pc.equal(column, pa.scalar(UNAVAILABLE, kind)), False)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return pc.fill_null(pc.equal(column, pa.scalar(UNAVAILABLE.encode(), kind)), False)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):  # an array column: [placeholder]
        inner = pc.list_element(pc.if_else(pc.equal(pc.list_value_length(column), 1), column, None), 0)
        return pc.fill_null(pc.equal(pc.cast(inner, pa.string()), UNAVAILABLE), False)
    return None


def fill_unavailable(
    changes: pa.Table, previous: Callable[[list[str]], Mapping[str, Mapping[str, Any] | None]]
) -> pa.Table:
    """Replace Debezium's ``__debezium_unavailable_value`` placeholders by the key's previous values.

    A TOASTed column an UPDATE left unchanged is not in PostgreSQL's logical decoding message
    (unless ``REPLICA IDENTITY FULL``), and Debezium writes the placeholder instead
    (:mod:`schemas.debezium`). The previous value of the key is its latest earlier row in
    ``changes``, else its row in the snapshot (``previous``); after a delete, or for a key never
    seen, the column is null. Only the rows of keys with a placeholder are visited.

    Args:
        changes: overlay log rows in read order (``__lk``, ``__deleted`` and the value columns).
        previous: lookup key list -> each key's current row in the snapshot (``None``: absent).

    Returns:
        ``changes`` with every placeholder replaced.
    """
    columns = [n for n in changes.column_names if not n.startswith("__")]
    masks = {n: m for n in columns if (m := _unavailable_mask(changes.column(n))) is not None}
    hit = [n for n, m in masks.items() if pc.any(m).as_py()]
    if not hit:
        return changes
    rows_with = pa.array([False] * changes.num_rows)
    for n in hit:
        rows_with = pc.or_(rows_with, masks[n])
    keys = pc.unique(changes.column(LK).filter(rows_with)).to_pylist()
    involved = pc.is_in(changes.column(LK), value_set=pa.array(keys, pa.string())).to_pylist()
    lks, deleted = changes.column(LK).to_pylist(), changes.column(DELETED).to_pylist()
    values = {n: changes.column(n).to_pylist() for n in hit}
    flagged = {n: masks[n].to_pylist() for n in hit}
    state: dict[str, Mapping[str, Any] | None] = dict(previous(keys))
    for i, mine in enumerate(involved):
        if not mine:
            continue
        lk = lks[i]
        if deleted[i]:
            state[lk] = None
            continue
        before = state.get(lk)
        for n in hit:
            if flagged[n][i]:
                values[n][i] = None if before is None else before.get(n)
        state[lk] = {n: values[n][i] for n in hit}
    for n in hit:
        position = changes.column_names.index(n)
        changes = changes.set_column(position, changes.field(n), pa.array(values[n], changes.field(n).type))
    return changes
