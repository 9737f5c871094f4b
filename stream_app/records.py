"""Output records as Spark columns: ``struct<topic, key, value, headers>`` for Spark's Kafka sink.

Every output of a micro-batch (enriched event, update records, dead letters)
is one such struct, so one pass over the batch writes all of them (the row
``topic`` column routes each record). Headers follow the project contracts:
the update ``version`` (:mod:`kernel.updates`: 8-byte big-endian int64)
and the dead letter headers (:mod:`kernel.dlq`), built here in the JVM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernel.dlq import DEFAULT_MESSAGE_MAX_BYTES, FRAMING_BYTES, OMITTED_HEADER, RECORD_BYTES_HEADER
from kernel.updates import SOURCE_TS_HEADER, VERSION_HEADER
from stream_app.spark_kafka_options import sink_options

HEADER_TYPE = "struct<key:string,value:binary>"
RECORD_FIELDS = ("topic", "key", "value", "headers")


def _f() -> Any:
    from pyspark.sql import functions

    return functions


def header(name: str, value: Any) -> Any:
    """One Kafka header: ``name`` and a binary (or string, encoded UTF-8) column."""
    f = _f()
    return f.struct(f.lit(name).alias("key"), value.cast("binary").alias("value"))


def no_headers() -> Any:
    """An empty header array of the right type."""
    f = _f()
    return f.array().cast(f"array<{HEADER_TYPE}>")


def version_bytes(version: Any) -> Any:
    """A long column as the ``version`` header value: 8 bytes, big-endian (two's complement)."""
    f = _f()
    return f.unhex(f.lpad(f.hex(version.cast("long")), 16, "0"))


def record(topic: str, key: Any, value: Any, headers: Any) -> Any:
    """A Kafka record struct for Spark's Kafka sink."""
    return record_of(_f().lit(topic), key, value, headers)


def record_of(*fields: Any) -> Any:
    """The record struct of its four columns, in :data:`RECORD_FIELDS` order."""
    f = _f()
    return f.struct(*[column.alias(name) for name, column in zip(RECORD_FIELDS, fields, strict=True)])


def update_record(topic: str, key: Any, value: Any, version: Any, source_ts: Any = None) -> Any:
    """An update record (``kernel.updates`` contract): key, value, ``version`` header.

    Args:
        topic: the update topic.
        key: the key column (binary).
        value: the value column (binary).
        version: the version column (long).
        source_ts: a binary column (8 bytes) carried as the ``threes.source_ts``
            header when not null (the source commit time of what caused the update).
    """
    f = _f()
    version_header = header(VERSION_HEADER, version_bytes(version))
    headers = f.array(version_header)
    if source_ts is not None:
        headers = f.when(source_ts.isNull(), headers).otherwise(
            f.array(version_header, header(SOURCE_TS_HEADER, source_ts))
        )
    return record(topic, key, value, headers)


def header_value(headers: Any, name: str, last: bool = False) -> Any:
    """The value (binary) of the first (``last``: the last) header called ``name`` in a header array column.

    Null when no header has that name, or the array is null. Built from
    ``array_position`` on the header keys, not a ``filter`` lambda: a
    higher-order function is interpreted, and Spark then interprets the whole
    operator holding it (the explode of every output record, with its Avro
    encoding, in :func:`record_rows`) instead of compiling it.
    """
    f = _f()
    keys, values = headers["key"], headers["value"]
    if last:
        from_end = f.array_position(f.reverse(keys), f.lit(name)).cast("int")
        return f.when(from_end > 0, f.element_at(values, -from_end))
    return f.get(values, (f.array_position(keys, f.lit(name)) - 1).cast("int"))


def dead_letter(topic: str, *args: Any, **kwargs: Any) -> Any:
    """A dead letter record struct: :func:`dead_letter_fields` as one column."""
    return record_of(*dead_letter_fields(topic, *args, **kwargs))


def dead_letter_fields(
    topic: str,
    stage: str,
    error_class: str,
    message: Any,
    component: str,
    *,
    source_topic: Any,
    partition: Any,
    offset: Any,
    key: Any,
    value: Any,
    headers: Any = None,
    max_bytes: int = DEFAULT_MESSAGE_MAX_BYTES,
) -> tuple[Any, Any, Any, Any]:
    """A dead letter record's columns (``kernel.dlq`` contract): original key, value and headers kept.

    A dead letter is always writable (:mod:`kernel.dlq`): when the original key and value exceed
    ``max_bytes`` less room for the headers, the value and the original headers are left out (the
    key too when it alone takes half of that), and ``dlq.omitted`` says so; ``dlq.record.bytes``
    gives the original key and value size. ``threes dlq replay`` then reads the original event
    back from its topic. The message is cut at 4,000 characters, as the sync service's.

    Args:
        topic: the dead letter topic.
        stage: where it failed (``decode``, ``transform``).
        error_class: the error's class name.
        message: a string column, why it failed.
        component: who dead-lettered it (the job's name).
        source_topic: original topic (string column).
        partition: original partition (int column).
        offset: original offset (long column).
        key: original key bytes.
        value: original value bytes.
        headers: original headers (appended after ours), or ``None``.
        max_bytes: the largest record the dead letter topic and the job's producer take, bytes.

    Returns:
        ``(topic, key, value, headers)`` columns, as :data:`RECORD_FIELDS`.
    """
    f = _f()
    context = [
        header("dlq.topic", source_topic),
        header("dlq.partition", partition.cast("string")),
        header("dlq.offset", offset.cast("string")),
        header("dlq.stage", f.lit(stage)),
        header("dlq.error.class", f.lit(error_class)),
        header("dlq.error.message", f.substring(message, 1, 4000)),
        header("dlq.component", f.lit(component)),
        header("dlq.timestamp_ms", f.unix_millis(f.current_timestamp()).cast("string")),
    ]
    return (f.lit(topic), *_fitted(context, key, value, headers, max_bytes))


def _fitted(context: list[Any], key: Any, value: Any, headers: Any, max_bytes: int) -> tuple[Any, Any, Any]:
    """``(key, value, headers)`` of a dead letter under ``max_bytes``: value and original headers left out over it."""
    f = _f()
    # 8 kB: the dlq.* headers (the message is cut at 4,000 characters) with room to spare
    budget = max(max_bytes - FRAMING_BYTES - 8192, 1024)
    key_bytes = f.coalesce(f.octet_length(key), f.lit(0))
    size = key_bytes + f.coalesce(f.octet_length(value), f.lit(0))
    over = size > f.lit(budget)
    drop_key = over & (key_bytes > f.lit(budget // 2))
    context = [*context, header(RECORD_BYTES_HEADER, size.cast("string"))]
    ours = f.array(*context)
    omitted = f.array(*context, header(OMITTED_HEADER, f.when(drop_key, f.lit("value,headers,key"))
                                       .otherwise(f.lit("value,headers"))))
    whole = ours if headers is None else f.concat(ours, f.coalesce(headers, no_headers()))
    all_headers = f.when(over, omitted).otherwise(whole)
    return f.when(~drop_key, key), f.when(~over, value), all_headers


def record_rows(records: Sequence[Any]) -> Any:
    """The generator of one output row per record column: ``inline`` of the array of ``records``.

    Select it, then keep the rows whose ``topic`` is not null: ``inline`` turns a
    null element (a record that does not apply to the event) into a row of nulls.
    A ``filter`` lambda on the array instead would make Spark interpret (not
    compile) every record expression. So would any higher-order function
    (lambda) inside a record: Spark then runs the whole ``Generate`` outside
    whole-stage code generation.
    """
    f = _f()
    return f.inline(f.array(*records))


def write_records(records: Any, options: dict[str, str]) -> None:
    """Write a batch of ``topic, key, value, headers`` rows with Spark's Kafka sink (at least once)."""
    writer = records.write.format("kafka").mode("append")
    for key, value in sink_options(options).items():
        writer = writer.option(key, value)
    writer.save()
