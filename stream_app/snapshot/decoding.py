"""The record decoders of the snapshot formats: Spark's Kafka rows to decoded snapshot records.

A compacted topic's key and value are single-object Avro, Confluent-framed Avro
(through the registry's writer schemas), Kafka Connect JSON (``schemas.enable=true``)
or, for keys, plain UTF-8 strings; a Debezium value is decoded as its envelope, whose
``after`` is the row. :func:`record_decoder` builds the decoding columns once and
returns a function of the raw rows giving the snapshot's record columns
(:mod:`stream_app.snapshot.data`) with ``__error`` the reason a record cannot be
used, which :func:`decode_error_reason` words for the dead letter headers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_app.snapshot.data import DELETED, ERROR, LH, LK, OFFSET, PARTITION, RANK, TOPIC, lookup_key


def _f() -> Any:
    from pyspark.sql import functions

    return functions


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
    formats = formats or RecordFormats()
    key_in, value_in, key, value, envelope_json = _decoded_columns(
        writers, key_schema_json, value_schema_json, key_type, key_format, formats
    )
    first = _raw_columns(key, value, formats, carry)
    second = _checked_columns(key_schema_json, value_schema_json, envelope_json, formats, carry)
    error = _error_column(writers, key_in, value_in, key_format, formats)
    third = _record_columns(key_type, topic_rank, error, formats, carry)

    def decode(raw: Any) -> Any:
        f = _f()
        rows = raw.select(*first).select(*second)
        if formats.debezium:
            # op t (truncate) and m (message) change no key: not a record of the snapshot
            rows = rows.filter(f.col("__e").isNull() | ~f.col("__e.op").isin("t", "m"))
        return rows.select(*third)

    return decode


def _decoded_columns(
    writers: Mapping[bytes, str],
    key_schema_json: str,
    value_schema_json: str,
    key_type: Any,
    key_format: str,
    formats: RecordFormats,
) -> tuple[Any, Any, Any, Any, str | None]:
    """The framed key and value columns and their decoded structs (see :func:`record_decoder`).

    Returns:
        ``(key_in, value_in, key, value, envelope_json)``: the key and value as single-object
        bytes, the decoded key, the decoded value (a Debezium value as its envelope) and the
        envelope reader schema (``None`` unless Avro Debezium values).
    """
    from stream_app.avro import decode_avro, from_confluent

    f = _f()
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
    return key_in, value_in, key, value, envelope_json


def _raw_columns(key: Any, value: Any, formats: RecordFormats, carry: Sequence[str]) -> list[Any]:
    """The first projection: the raw record and its decoded key (``__k``) and value (``__v``, or ``__e``)."""
    f = _f()
    return [
        "key",
        "value",
        f.col("topic").alias(TOPIC),
        f.col("partition").alias(PARTITION),
        f.col("offset").alias(OFFSET),
        key.alias("__k"),
        value.alias("__e" if formats.debezium else "__v"),
        *carry,
    ]


def _checked_columns(
    key_schema_json: str,
    value_schema_json: str,
    envelope_json: str | None,
    formats: RecordFormats,
    carry: Sequence[str],
) -> list[Any]:
    """The second projection: decoded key and value, ``null`` where a corrupt body hid behind nulls."""
    f = _f()
    if formats.debezium:
        # checked as the envelope (op is required); a delete's after is null
        env = f.col("__e")
        decoded_env = corrupt_to_null(env, envelope_json) if envelope_json else f.when(env["op"].isNotNull(), env)
        value_checks = [decoded_env.alias("__e")]
    else:
        value_checks = [corrupt_to_null(f.col("__v"), value_schema_json).alias("__v")]
    return [
        "key",
        "value",
        TOPIC,
        PARTITION,
        OFFSET,
        corrupt_to_null(f.col("__k"), key_schema_json).alias("__k"),
        *value_checks,
        *carry,
    ]


def _error_column(
    writers: Mapping[bytes, str], key_in: Any, value_in: Any, key_format: str, formats: RecordFormats
) -> Any:
    """Why a checked record cannot be used (``__error``), ``null`` if it can."""
    f = _f()
    decoded = f.col("__e") if formats.debezium else f.col("__v")

    def reason(col: Any, fmt: str, what: str) -> Any:
        if fmt == "connect_json":
            return f.lit(f"{what} is not Kafka Connect JSON (schemas.enable=true) of the reader schema")
        return decode_error_reason(col, writers, what)

    return (
        f.when(f.col("key").isNull(), f.lit("record has no key"))
        .when(f.col("__k").isNull(), reason(key_in, key_format, "key"))
        .when(f.col("value").isNotNull() & decoded.isNull(), reason(value_in, formats.value_format, "value"))
    )


def _record_columns(
    key_type: Any, topic_rank: Mapping[str, int], error: Any, formats: RecordFormats, carry: Sequence[str]
) -> list[Any]:
    """The last projection: the snapshot record columns (see :func:`decode_records`)."""
    f = _f()
    rank = f.lit(0)
    for topic, position in sorted(topic_rank.items(), key=lambda kv: kv[1]):
        rank = f.when(f.col(TOPIC) == topic, f.lit(position)).otherwise(rank)
    lk = lookup_key(f.col("__k"), key_type)
    deleted = f.col("value").isNull()
    if formats.debezium:
        deleted = deleted | (f.col("__e.op") == f.lit("d"))
    return [
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
