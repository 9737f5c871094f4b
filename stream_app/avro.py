"""Avro single-object encoding in Spark, decoded and encoded in the JVM (no Python UDF).

Spark's ``from_avro``/``to_avro`` read and write the bare Avro binary body. The
project's wire format (:mod:`schemas.serde`) puts a 10-byte header in front:
``C3 01`` and the writer schema's 8-byte CRC-64-AVRO fingerprint. Decoding
therefore picks, per record, the writer schema whose fingerprint the header
names and lets Avro's schema resolution map it to the reader schema
(``from_avro`` option ``avroSchema``), one ``when`` branch per known writer
schema. All of it is Catalyst expressions: the bytes never visit Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.registry import CONFLUENT_HEADER_BYTES, MAGIC_BYTE
from schemas.serde import HEADER_BYTES, MARKER


def _f() -> Any:
    from pyspark.sql import functions

    return functions


def avro_body(col: Any) -> Any:
    """The Avro body of a single-object encoded binary column (header stripped)."""
    f = _f()
    return col.substr(f.lit(HEADER_BYTES + 1), f.length(col) - f.lit(HEADER_BYTES))


def fingerprint_hex(col: Any) -> Any:
    """The writer fingerprint of each record as 16 lowercase hex characters (null if no header)."""
    f = _f()
    return f.when(col.substr(1, 2) == f.lit(MARKER), f.lower(f.hex(col.substr(3, 8))))


def decode_avro(col: Any, writer_schemas: Mapping[bytes, str], reader_schema_json: str) -> Any:
    """Decode single-object Avro into a struct of the reader schema.

    Args:
        col: a binary column (Kafka ``key`` or ``value``).
        writer_schemas: 8-byte fingerprint -> writer schema JSON, e.g.
            ``SchemaStore.schemas_json()``.
        reader_schema_json: the schema the job reads with (schema resolution
            applies: added fields with defaults, removed fields).

    Returns:
        A struct column; ``null`` for a null input (tombstone), a missing marker,
        an unknown fingerprint, or a body that does not decode (PERMISSIVE mode).
        Callers tell a tombstone from a bad record by ``col.isNull()``.
    """
    from pyspark.sql.avro.functions import from_avro

    f = _f()
    body = avro_body(col)
    has_marker = col.substr(1, 2) == f.lit(MARKER)
    # the first branch can never match; it fixes the result type when no writer is known
    result = f.when(f.lit(False), from_avro(body, reader_schema_json, {"mode": "PERMISSIVE"}))
    for fp, writer_json in sorted(writer_schemas.items()):
        options = {"mode": "PERMISSIVE", "avroSchema": reader_schema_json}
        result = result.when(has_marker & (col.substr(3, 8) == f.lit(fp)), from_avro(body, writer_json, options))
    return result


def from_confluent(col: Any, headers: Mapping[bytes, bytes]) -> Any:
    """Confluent-framed records as single-object ones: the 5-byte prefix swapped for the writer's header.

    Confluent's wire format is ``00 | 4-byte schema id | Avro body``; the body is the same Avro
    binary as a single-object record's, so only the prefix changes and :func:`decode_avro` decodes
    the result with its per-fingerprint branches (one ``CASE`` over the known ids, in the JVM).

    Args:
        col: a binary column (Kafka ``key`` or ``value``).
        headers: Confluent prefix (magic byte, big-endian id) -> 10-byte single-object header
            (:meth:`stream_app.writers.RegistryWriters.headers`).

    Returns:
        A binary column: single-object bytes for a known id; the bytes unchanged otherwise (an
        unknown id, not Confluent-framed, ``null``), which :func:`decode_avro` does not decode and
        :func:`stream_app.snapshot.decoding.decode_error_reason` names.
    """
    f = _f()
    if not headers:
        return col
    prefix = col.substr(1, CONFLUENT_HEADER_BYTES)
    body = col.substr(f.lit(CONFLUENT_HEADER_BYTES + 1), f.length(col) - f.lit(CONFLUENT_HEADER_BYTES))
    result = None
    for confluent, single in sorted(headers.items()):
        branch = f.concat(f.lit(single), body)
        result = f.when(prefix == f.lit(confluent), branch) if result is None else result.when(
            prefix == f.lit(confluent), branch
        )
    assert result is not None
    return result.otherwise(col)


def confluent_id(col: Any) -> Any:
    """The schema id of each Confluent-framed record as a decimal string (null when not Confluent-framed)."""
    f = _f()
    framed_ = (col.substr(1, 1) == f.lit(MAGIC_BYTE)) & (f.length(col) >= CONFLUENT_HEADER_BYTES)
    return f.when(framed_, f.conv(f.hex(col.substr(2, 4)), 16, 10))


def framed(body: Any, fingerprint: bytes) -> Any:
    """A bare Avro body column framed as single-object encoding under ``fingerprint`` (null stays null)."""
    f = _f()
    return f.concat(f.lit(MARKER + fingerprint), body)


def encode_avro(col: Any, schema_json: str, fingerprint: bytes) -> Any:
    """Encode a struct column as single-object Avro with the given writer schema.

    Args:
        col: a struct column whose fields match ``schema_json``.
        schema_json: the writer schema; it must be registered in the schema
            store under ``fingerprint`` before readers see the records.
        fingerprint: the 8-byte fingerprint of ``schema_json``
            (:func:`schemas.serde.fingerprint`).

    Returns:
        A binary column; ``null`` where ``col`` is null (a tombstone).
    """
    from pyspark.sql.avro.functions import to_avro

    f = _f()
    return f.when(col.isNotNull(), f.concat(f.lit(MARKER + fingerprint), to_avro(col, schema_json)))
