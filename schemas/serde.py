"""The one Avro serde of threes: single-object encoding with fastavro.

Wire format (Avro 1.x specification, "Single-object encoding")::

    C3 01 | 8-byte CRC-64-AVRO fingerprint of the writer schema (little-endian) | Avro binary body

The fingerprint is of the writer schema's *logical canonical form*
(:func:`canonical_form`): the Avro Parsing Canonical Form extended with the
attributes that change how a body decodes (``logicalType``, ``precision``,
``scale``), so ``decimal(12,2)`` and ``decimal(12,4)``, ``timestamp-millis`` and
``timestamp-micros``, ``date`` and ``int`` never share a fingerprint. A schema
without logical types has exactly its Parsing Canonical Form, hence the same
fingerprint as before this extension. The framing is unchanged (an 8-byte
CRC-64-AVRO), which is all Spark's ``from_avro`` path relies on. Writer
schemas are kept in a :class:`~schemas.store.SchemaStore` (a compacted topic,
keyed by fingerprint), so any reader can resolve one it has not seen. Readers
may pass a *reader schema* and get Avro schema resolution (added fields with
defaults, removed fields) as the specification defines it.

Serializers and deserializers are callables ``(obj, ctx) -> bytes`` /
``(data, ctx) -> obj`` like confluent-kafka's, ``ctx`` being optional and unused.
A ``None`` value is a tombstone both ways.
"""

from __future__ import annotations

import io
import json
from typing import Any, Protocol, overload

import fastavro
from fastavro.schema import fingerprint as _fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form

from schemas.exceptions import NotSingleObjectError, SerdeError

MARKER = b"\xc3\x01"
HEADER_BYTES = 10  # marker (2) + fingerprint (8)

Schema = dict[str, Any] | list[Any] | str


class SchemaResolver(Protocol):
    """What a deserializer needs: the writer schema of a fingerprint."""

    def get(self, fingerprint: bytes) -> Any:
        """Return the parsed writer schema, or raise ``UnknownSchemaError``."""


def parse(schema: Schema | str) -> Any:
    """Parse an Avro schema given as a dict/list or as its JSON text.

    Returns:
        The fastavro parsed schema (named types expanded).

    Raises:
        SerdeError: the schema is not valid Avro.
    """
    if isinstance(schema, str) and schema.lstrip().startswith(("{", "[", '"')):
        schema = json.loads(schema)
    try:
        return fastavro.parse_schema(schema)
    except Exception as exc:  # fastavro raises SchemaParseException and plain errors
        raise SerdeError(f"invalid Avro schema: {exc}") from exc


# Attributes of a type that change how its binary body decodes, in the order they are written
# after the Parsing Canonical Form's own (name, type, fields, symbols, items, values, size).
_LOGICAL_ATTRIBUTES = ("logicalType", "precision", "scale")


def _canonical(schema: Any, out: list[str]) -> None:
    if isinstance(schema, list):
        out.append("[")
        for i, branch in enumerate(schema):
            if i:
                out.append(",")
            _canonical(branch, out)
        out.append("]")
        return
    if not isinstance(schema, dict):  # a primitive or a reference to a named type (full name)
        out.append(json.dumps(schema))
        return
    kind = schema["type"]
    parts: list[str] = []
    if kind in ("record", "error", "enum", "fixed"):
        parts.append(f'"name":{json.dumps(schema["name"])}')
    parts.append(f'"type":{json.dumps("record" if kind == "error" else kind)}')
    if kind in ("record", "error"):
        fields = []
        for field in schema["fields"]:
            sub: list[str] = []
            _canonical(field["type"], sub)
            fields.append(f'{{"name":{json.dumps(field["name"])},"type":{"".join(sub)}}}')
        parts.append(f'"fields":[{",".join(fields)}]')
    elif kind == "enum":
        parts.append(f'"symbols":{json.dumps(schema["symbols"], separators=(",", ":"))}')
    elif kind in ("array", "map"):
        sub = []
        _canonical(schema["items" if kind == "array" else "values"], sub)
        parts.append(f'"{"items" if kind == "array" else "values"}":{"".join(sub)}')
    elif kind == "fixed":
        parts.append(f'"size":{int(schema["size"])}')
    logical = schema.get("logicalType")
    if logical is None and kind not in ("record", "error", "enum", "fixed", "array", "map"):
        out.append(json.dumps(kind))  # a primitive written as {"type": "int"} is "int" ([PRIMITIVES])
        return
    if logical is not None:
        parts.append(f'"logicalType":{json.dumps(logical)}')
        if logical == "decimal":  # the specification's defaults: scale 0 when absent
            parts.append(f'"precision":{int(schema["precision"])}')
            parts.append(f'"scale":{int(schema.get("scale", 0))}')
    out.append("{" + ",".join(parts) + "}")


def canonical_form(schema: Schema) -> str:
    """The schema's logical canonical form: what decides how a body decodes, and nothing else.

    It is the Avro specification's Parsing Canonical Form ("Parsing Canonical
    Form for Schemas": full names, no docs, aliases or defaults, fixed attribute
    order, no whitespace) extended with ``logicalType`` and, for ``decimal``,
    ``precision`` and ``scale`` (scale 0 when absent), written after the
    Parsing Canonical Form's own attributes. This is the idea of Avro 1.12's
    standard canonical form restricted to the attributes that matter to a
    decoder. A schema without logical types gives exactly its Parsing
    Canonical Form.

    Args:
        schema: an Avro schema (dict, list, or JSON text).

    Returns:
        The canonical JSON text.

    Raises:
        SerdeError: the schema is not valid Avro.
    """
    out: list[str] = []
    _canonical(parse(schema), out)
    return "".join(out)


def fingerprint(schema: Schema) -> bytes:
    """CRC-64-AVRO (Rabin) fingerprint of a schema's logical canonical form (:func:`canonical_form`).

    Two schemas that decode a body differently (a decimal's scale, millis
    vs micros, ``date`` vs ``int``) never share it. For a schema without
    logical types it equals :func:`parsing_fingerprint`.

    Args:
        schema: an Avro schema (dict, list, or JSON text).

    Returns:
        8 bytes, little-endian, exactly as they appear in single-object encoding.

    Raises:
        SerdeError: the schema is not valid Avro.
    """
    return bytes.fromhex(_fastavro_fingerprint(canonical_form(schema), "CRC-64-AVRO"))


def parsing_fingerprint(schema: Schema) -> bytes:
    """The fingerprint of the plain Parsing Canonical Form (logical types dropped).

    What threes wrote before the logical canonical form; records framed with it
    still decode (the schema topic maps each stored fingerprint to its full
    schema), but it is never used for new records.

    Returns:
        8 bytes, little-endian.
    """
    pcf = to_parsing_canonical_form(parse(schema))
    return bytes.fromhex(_fastavro_fingerprint(pcf, "CRC-64-AVRO"))


def non_null_type(avro_type: Any) -> tuple[Any, bool]:
    """The type a field's values have, and whether it may be null: ``["null", T]`` gives ``(T, True)``.

    Returns:
        ``(T, nullable)``; ``T`` is ``None`` for a union of several non-null branches.
    """
    if isinstance(avro_type, list):
        branches = [b for b in avro_type if b != "null"]
        return (branches[0] if len(branches) == 1 else None), len(branches) < len(avro_type)
    return avro_type, False


def schema_json(schema: Schema) -> str:
    """The schema as compact JSON, logical types and defaults kept (what readers need)."""
    if isinstance(schema, str) and schema.lstrip().startswith(("{", "[", '"')):
        schema = json.loads(schema)
    return json.dumps(schema, separators=(",", ":"), sort_keys=True)


def split(data: bytes) -> tuple[bytes, memoryview]:
    """Split a single-object encoded message into fingerprint and body.

    Args:
        data: the message bytes.

    Returns:
        ``(fingerprint, body)``; fingerprint is 8 bytes.

    Raises:
        NotSingleObjectError: the bytes are shorter than the header or lack the marker.
    """
    if len(data) < HEADER_BYTES or data[:2] != MARKER:
        head = bytes(data[:2]).hex() or "empty"
        raise NotSingleObjectError(
            f"not Avro single-object encoding (expected marker c301, found {head}, {len(data)} bytes)"
        )
    view = memoryview(data)
    return bytes(view[2:HEADER_BYTES]), view[HEADER_BYTES:]


class AvroSerializer:
    """Encode dicts as single-object Avro with one writer schema.

    Args:
        schema: the writer schema.
        store: where the writer schema is registered (once, on construction), or
            ``None`` when the caller registers it.
        fp: frame with this fingerprint instead of the schema's own; the caller
            knows the store holds the schema under it (keys written before the
            logical canonical form, see :func:`schemas.evolution.legacy_key_fingerprint`).

    Raises:
        SerdeError: from ``__call__`` when a value does not match the schema; the
            message names the field when fastavro does.
    """

    def __init__(self, schema: Schema, store: Any | None = None, *, fp: bytes | None = None):
        self.schema = parse(schema)
        self.fingerprint = fp or fingerprint(schema)
        self.header = MARKER + self.fingerprint
        if store is not None and self.fingerprint == fingerprint(schema):
            store.register(schema)

    @overload
    def __call__(self, obj: None, ctx: Any = None) -> None: ...

    @overload
    def __call__(self, obj: Any, ctx: Any = None) -> bytes: ...

    def __call__(self, obj: Any, ctx: Any = None) -> bytes | None:
        """Encode ``obj``; ``None`` (tombstone) stays ``None``."""
        if obj is None:
            return None
        buf = io.BytesIO()
        buf.write(self.header)
        try:
            fastavro.schemaless_writer(buf, self.schema, obj, strict_allow_default=True)
        except Exception as exc:  # ValueError/TypeError/fastavro errors: name the record problem
            raise SerdeError(f"value does not match schema {self.schema.get('name', '')!s}: {exc}") from exc
        return buf.getvalue()


class AvroDeserializer:
    """Decode single-object Avro, resolving the writer schema by fingerprint.

    Args:
        resolver: where writer schemas are found (a :class:`~schemas.store.SchemaStore`).
        reader_schema: the schema the caller wants; ``None`` reads with the writer schema.
    """

    def __init__(self, resolver: SchemaResolver, reader_schema: Schema | None = None):
        self.resolver = resolver
        self.reader_schema = parse(reader_schema) if reader_schema is not None else None

    def __call__(self, data: bytes | None, ctx: Any = None) -> Any:
        """Decode ``data``; ``None`` (tombstone) stays ``None``.

        Raises:
            NotSingleObjectError: no single-object header.
            UnknownSchemaError: the fingerprint is not registered anywhere.
            SerdeError: the body does not decode with the writer schema, or does
                not resolve to the reader schema.
        """
        if data is None:
            return None
        fp, body = split(data)
        writer = self.resolver.get(fp)
        try:
            return fastavro.schemaless_reader(io.BytesIO(body), writer, self.reader_schema)
        except Exception as exc:
            raise SerdeError(f"cannot decode Avro body with writer schema {fp.hex()}: {exc}") from exc
