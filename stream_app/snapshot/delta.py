"""Small snapshot deltas decoded on the driver with fastavro: a refresh without a Spark job.

Between two micro-batches a snapshot usually has a few records to read (the
1k-update refresh of ``benchmarks/stream_join.py``). Reading them costs one
consumer fetch; decoding them in the JVM costs a Spark job (a DataFrame from
the bytes, ``from_avro``, ``toArrow``): a fixed ~0.3-1 s on a loaded 2-core
machine, most of the refresh. Here the same records are decoded by fastavro
into the overlay log's Arrow table in a few milliseconds.

This is not the hot path: events are always decoded in the JVM, and so are
large deltas, bootstraps and anything this decoder does not handle exactly as
Spark's ``from_avro`` would. The decoder says so by returning ``None``, and the
caller then uses the JVM path, which also sends undecodable records to the
dead letter topic with their reason. It returns ``None`` when:

* the key is not a single string or integral field (composite keys render
  their lookup key with Spark's ``to_json``, which is not reproduced here);
* a reader schema holds a type whose Spark form differs from fastavro's
  value (unions of several non-null types, ``time-*``, ``uuid``,
  ``duration``);
* any record has no key, no single-object header, an unknown writer schema,
  or a body that does not decode (the JVM path dead-letters those).

Both sides compute the same columns: ``__lk`` is the key field as a string
(Spark's ``cast("string")`` of a string or integer) and ``__lh`` Spark's
``xxhash64(__lk)``, which is XXH64 of the UTF-8 bytes with seed 42
(``org.apache.spark.sql.catalyst.expressions.XXH64``), computed here with the
``xxhash`` library. A unit test checks both paths give equal tables.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Mapping
from typing import Any

import fastavro
import pyarrow as pa
import xxhash

from schemas.serde import HEADER_BYTES, MARKER
from stream_app.snapshot.data import DELETED, LH, LK, OFFSET, PARTITION, TOPIC

log = logging.getLogger(__name__)

SPARK_HASH_SEED = 42  # Spark's XxHash64 expression seed
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}
_LOGICAL = {
    "timestamp-millis",
    "timestamp-micros",
    "local-timestamp-millis",
    "local-timestamp-micros",
    "date",
    "decimal",
}
_NOT_SUPPORTED = {"time-millis", "time-micros", "uuid", "duration"}


def spark_xxhash64(text: str) -> int:
    """Spark's ``xxhash64`` of a string column value (a signed 64-bit integer)."""
    value = xxhash.xxh64_intdigest(text.encode("utf-8"), SPARK_HASH_SEED)
    return value - (1 << 64) if value >= 1 << 63 else value


def supported_schema(schema: Any, named: set[str] | None = None) -> bool:
    """Whether fastavro's values of ``schema`` convert to the Arrow type of Spark's ``from_avro`` column.

    Args:
        schema: an Avro schema (parsed JSON).
        named: full names of the named types defined so far (references).
    """
    named = set() if named is None else named
    if isinstance(schema, str):
        return schema in _PRIMITIVES or schema in named or any(n.rsplit(".", 1)[-1] == schema for n in named)
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        return len(branches) <= 1 and all(supported_schema(b, named) for b in branches)
    if not isinstance(schema, dict):
        return False
    logical = schema.get("logicalType")
    if logical in _NOT_SUPPORTED or (logical is not None and logical not in _LOGICAL):
        return False
    kind = schema.get("type")
    if kind in ("record", "error", "enum", "fixed"):
        name = schema.get("name", "")
        named.add(f"{schema['namespace']}.{name}" if schema.get("namespace") and "." not in name else name)
    if kind in ("record", "error"):
        return all(supported_schema(fld["type"], named) for fld in schema.get("fields", []))
    if kind == "array":
        return supported_schema(schema["items"], named)
    if kind == "map":
        return supported_schema(schema["values"], named)
    if kind in ("enum", "fixed"):
        return True
    return supported_schema(kind, named)


def simple_key_field(key_type: Any) -> str | None:
    """The key's one field when :func:`~stream_app.snapshot.data.lookup_key` renders it as a cast, else ``None``."""
    from pyspark.sql import types as T

    fields = key_type.fields
    if len(fields) == 1 and isinstance(
        fields[0].dataType, T.StringType | T.IntegerType | T.LongType | T.ShortType | T.ByteType
    ):
        return fields[0].name
    return None


class DriverDecoder:
    """Decodes compacted-topic records into overlay log rows on the driver (see module docstring).

    Args:
        writers: the writer schemas that resolve to the key or the value reader
            schema, fingerprint -> JSON.
        key_schema_json: reader schema of the keys.
        value_schema_json: reader schema of the values.
        key_field: the key's one field (:func:`simple_key_field`).
        log_schema: the Arrow schema of an overlay log table (``__lk, __lh,
            __deleted, __topic, __partition, __offset`` + value fields).
        topic_rank: topic -> position in the snapshot's topic list.
        key_format: ``avro`` or ``string`` (plain UTF-8 keys, taken as they are;
            one that is not valid UTF-8 goes to the JVM path, which decodes it
            as Spark's cast does).
    """

    def __init__(
        self,
        writers: Mapping[bytes, str],
        key_schema_json: str,
        value_schema_json: str,
        key_field: str,
        log_schema: pa.Schema,
        topic_rank: Mapping[str, int],
        key_format: str = "avro",
    ):
        self.string_keys = key_format == "string"
        self.writers = {fp: fastavro.parse_schema(json.loads(text)) for fp, text in writers.items()}
        self.key_reader = fastavro.parse_schema(json.loads(key_schema_json))
        self.value_reader = fastavro.parse_schema(json.loads(value_schema_json))
        self.key_field, self.schema, self.rank = key_field, log_schema, dict(topic_rank)
        self.value_names = log_schema.names[6:]

    def _body(self, data: bytes, reader: Any) -> Any:
        if len(data) < HEADER_BYTES or data[:2] != MARKER:
            raise ValueError("no single-object header")
        writer = self.writers.get(bytes(data[2:HEADER_BYTES]))
        if writer is None:
            raise ValueError("unknown writer schema")
        return fastavro.schemaless_reader(io.BytesIO(data[HEADER_BYTES:]), writer, reader)

    def decode(self, records: pa.Table) -> pa.Table | None:
        """Overlay log rows of raw records, in the JVM path's order (topic rank, partition, offset).

        Args:
            records: ``key, value, topic, partition, offset`` as
                :class:`stream_app.kafka_io.RangeReader` reads them.

        Returns:
            A table of :attr:`schema`, or ``None`` when a record needs the JVM
            path (undecodable, or a value this decoder does not reproduce).
        """
        rows = sorted(
            zip(
                *(records.column(c).to_pylist() for c in ("key", "value", "topic", "partition", "offset")), strict=True
            ),
            key=lambda r: (self.rank.get(r[2], 0), r[3], r[4]),
        )
        out: dict[str, list[Any]] = {name: [] for name in self.schema.names}
        for key, value, topic, partition, offset in rows:
            try:
                if key is None:
                    return None
                if self.string_keys:
                    lk = bytes(key).decode("utf-8")
                else:
                    lk = self._body(key, self.key_reader)[self.key_field]
                decoded = None if value is None else self._body(value, self.value_reader)
            except Exception as exc:  # the JVM path names the reason in the dead letter
                log.debug("record %s[%d]@%d needs the JVM decoder: %s", topic, partition, offset, exc)
                return None
            if lk is None or isinstance(lk, bool):
                return None
            lk = str(lk)
            out[LK].append(lk)
            out[LH].append(spark_xxhash64(lk))
            out[DELETED].append(decoded is None)
            out[TOPIC].append(topic)
            out[PARTITION].append(partition)
            out[OFFSET].append(offset)
            for name in self.value_names:
                out[name].append(None if decoded is None else decoded.get(name))
        try:
            return pa.table(out, schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
            log.debug("delta does not convert to the log schema (%s): JVM decoding", exc)
            return None
