"""Avro bodies of a whole Arrow table at once: one single-object encoded message per row, built with numpy.

A source that reads rows in batches (``RdsSource`` on PostgreSQL) hands the
worker an Arrow table instead of one dict per row; :class:`ColumnarEncoder`
then writes the key and value of every row in a few numpy passes per column
instead of one ``fastavro.schemaless_writer`` call (and one dict walk) per
record, a fraction of fastavro's CPU per row (``benchmarks/rds_source.py``,
``rds_source`` in benchmarks/RESULTS.md).

The bytes are exactly fastavro's (unit-tested value by value against
:class:`schemas.serde.AvroSerializer`, edge values included), following the
Avro specification's binary encoding:

* ``int``/``long`` and the logical types on them (``date``, ``time-*``,
  ``timestamp-*``, ``local-timestamp-*``): zig-zag varints;
* ``float``/``double``: 4/8 bytes little-endian; ``boolean``: one byte;
* ``string``/``bytes`` (``uuid`` strings too): a varint length, then the bytes;
* ``decimal`` on ``bytes``: the unscaled integer big-endian in two's complement,
  in ``bit_length(|unscaled|) // 8 + 1`` bytes (fastavro's length rule), for
  unscaled values within 64 bits;
* a union ``["null", T]`` (either order): the branch index as a varint, then ``T``.

Anything else (arrays, maps, nested records, enums, fixed, other unions) makes
:class:`ColumnarEncoder` refuse the schema up front (:class:`ColumnarUnsupported`),
and the caller keeps the per-record path. A batch the encoder cannot write
(a null in a non-null field, a decimal beyond 64 bits) raises ``ValueError``:
the worker then encodes that batch record by record, which names the bad
record and field exactly as before.

Each column becomes one or two *pieces* (``(lengths, data)``: a byte length per
row and the rows' bytes concatenated); the pieces of a row are then laid out
next to each other with one scatter per piece (an index built with
``numpy.repeat``), and the rows are cut into ``bytes`` by slicing one buffer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

_LOGICAL = {
    ("int", "date"): "int",
    ("int", "time-millis"): "int",
    ("long", "time-micros"): "long",
    ("long", "timestamp-millis"): "long",
    ("long", "timestamp-micros"): "long",
    ("long", "local-timestamp-millis"): "long",
    ("long", "local-timestamp-micros"): "long",
    ("string", "uuid"): "string",
}
_PRIMITIVES = {"boolean", "int", "long", "float", "double", "string", "bytes"}

_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)
_VARINT_STEPS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)
_TEN = np.arange(10)
_DEC_STEPS = np.array([1 << (8 * k - 1) for k in range(1, 9)], dtype=np.uint64)
_NINE = np.arange(9)
_DEC_SHIFTS = np.array([63, 56, 48, 40, 32, 24, 16, 8, 0], dtype=np.int64)

Piece = tuple[Any, np.ndarray]
"""``(lengths, data)``: bytes per row (an int when every row has the same) and the rows' bytes concatenated."""


class ColumnarUnsupported(ValueError):
    """The schema has a type the columnar encoder does not write; use the per-record path."""


@dataclass(frozen=True)
class _Field:
    name: str
    kind: str  # boolean int long float double string bytes decimal
    arrow_type: Any
    nullable: bool
    null_branch: int = 0
    value_branch: int = 0
    scale: int = 0


def _field_of(f: Mapping[str, Any]) -> _Field:
    from schemas.arrow import UnsupportedAvroType, arrow_type

    typ = f["type"]
    nullable, null_branch, value_branch = False, 0, 0
    if isinstance(typ, list):
        branches = [b for b in typ if b != "null"]
        if len(branches) != 1 or len(typ) != 2:
            raise ColumnarUnsupported(f"field {f['name']!r}: union {typ!r}")
        nullable, null_branch, value_branch = True, typ.index("null"), typ.index(branches[0])
        typ = branches[0]
    kind, scale = _kind_of(typ, f["name"])
    try:
        arrow = arrow_type(typ)
    except UnsupportedAvroType as exc:
        raise ColumnarUnsupported(f"field {f['name']!r}: {exc}") from exc
    return _Field(f["name"], kind, arrow, nullable, null_branch, value_branch, scale)


def _kind_of(typ: Any, name: str) -> tuple[str, int]:
    if isinstance(typ, str):
        if typ in _PRIMITIVES:
            return typ, 0
        raise ColumnarUnsupported(f"field {name!r}: type {typ!r}")
    if not isinstance(typ, dict):
        raise ColumnarUnsupported(f"field {name!r}: type {typ!r}")
    base, logical = typ.get("type"), typ.get("logicalType")
    if logical is None and isinstance(base, str) and base in _PRIMITIVES:
        return base, 0
    if (base, logical) in _LOGICAL:
        return _LOGICAL[cast("tuple[str, str]", (base, logical))], 0
    if base == "bytes" and logical == "decimal":
        return "decimal", int(typ.get("scale", 0))
    raise ColumnarUnsupported(f"field {name!r}: type {typ!r}")


def _fields_of(schema: Mapping[str, Any]) -> list[_Field]:
    if not isinstance(schema, Mapping) or schema.get("type") != "record":
        raise ColumnarUnsupported("not a record schema")
    return [_field_of(f) for f in schema["fields"]]


# -- pieces -----------------------------------------------------------------------------------------------


def varint(z: np.ndarray, skip: np.ndarray | None = None) -> Piece:
    """Unsigned LEB128 varints (Avro's variable-length integers) of ``z``.

    Args:
        z: ``uint64`` values (zig-zag encoded already where signed).
        skip: rows that write nothing (nulls of a union).
    """
    n = 1 + np.searchsorted(_VARINT_STEPS, z, side="right")
    if skip is not None:
        n[skip] = 0
    width = int(n.max()) if len(n) else 0  # only as many 7-bit groups as the longest varint needs
    cols = _TEN[:width]
    groups = ((z[:, None] >> _SHIFTS[:width]) & np.uint64(0x7F)).astype(np.uint8)
    groups |= (cols < (n - 1)[:, None]).astype(np.uint8) << 7
    return n, groups[cols < n[:, None]]


def zigzag(v: np.ndarray) -> np.ndarray:
    """Avro's zig-zag mapping of signed 64-bit integers to unsigned ones."""
    v = v.astype(np.int64, copy=False)
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


def decimal_bytes(unscaled: np.ndarray, skip: np.ndarray | None = None) -> Piece:
    """Big-endian two's complement of ``int64`` unscaled decimals, in fastavro's length.

    fastavro writes ``bit_length(abs(u)) // 8 + 1`` bytes (one more than minimal for
    some negative values, e.g. -128 as ``ff 80``); the bytes here are the same.
    """
    u = unscaled.astype(np.int64, copy=False)
    uu = u.view(np.uint64)
    magnitude = np.where(u < 0, ~uu + np.uint64(1), uu)
    n = 1 + np.searchsorted(_DEC_STEPS, magnitude, side="right")
    if skip is not None:
        n[skip] = 0
    width = int(n.max()) if len(n) else 0
    # column j holds the byte of weight width - 1 - j (of a 9-byte value, column 0 is the sign byte)
    grid = ((u[:, None] >> _DEC_SHIFTS[9 - width :]) & 0xFF).astype(np.uint8)
    return n, grid[_NINE[:width] >= (width - n)[:, None]]


def _nulls(arr: Any) -> np.ndarray | None:
    if arr.null_count == 0:
        return None
    mask: np.ndarray = arr.is_null().to_numpy(zero_copy_only=False)
    return mask


def _ints(arr: Any) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_integer(arr.type):
        arr = pc.cast(arr, pa.int64() if arr.type.bit_width == 64 else pa.int32())
    values: np.ndarray = arr.fill_null(0).to_numpy(zero_copy_only=False)
    return values


def _binary(arr: Any, skip: np.ndarray | None) -> list[Piece]:
    import pyarrow as pa

    if arr.type != pa.large_binary():
        arr = arr.cast(pa.large_binary())
    bufs = arr.buffers()
    n = len(arr)
    offsets = np.frombuffer(bufs[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.empty(0, np.uint8)
    lengths = np.diff(offsets)
    if skip is not None:
        lengths = np.where(skip, 0, lengths)
        keep = np.repeat(~skip, np.diff(offsets))
        data = data[offsets[0] : offsets[-1]][keep]
    else:
        data = data[offsets[0] : offsets[-1]]
    return [varint(zigzag(lengths), skip), (lengths, data)]


def _fixed(values: np.ndarray, width: int, skip: np.ndarray | None) -> Piece:
    data = np.ascontiguousarray(values).view(np.uint8).reshape(len(values), width)
    if skip is None:
        return width, data.ravel()
    return np.where(skip, 0, width), data[~skip].ravel()


def _decimal(arr: Any, field: _Field, skip: np.ndarray | None) -> list[Piece]:
    import pyarrow as pa

    if not pa.types.is_decimal128(arr.type) or arr.type.scale != field.scale:
        arr = arr.cast(pa.decimal128(38, field.scale))
    words = np.frombuffer(arr.buffers()[1], dtype=np.int64)[2 * arr.offset : 2 * (arr.offset + len(arr))]
    words = words.reshape(len(arr), 2)
    lo, hi = words[:, 0], words[:, 1]
    fits = hi == (lo >> 63)
    if skip is not None:
        lo = np.where(skip, 0, lo)
        fits |= skip
    if not fits.all():
        raise ValueError(f"field {field.name!r}: a decimal beyond 64 bits unscaled")
    n, data = decimal_bytes(lo, skip)
    return [varint(zigzag(n), skip), (n, data)]


def field_pieces(arr: Any, field: _Field) -> tuple[np.ndarray | None, list[Piece]]:
    """``(null rows, pieces)`` of one column of ``field``'s non-null type (the union's index not included).

    Raises:
        ValueError: a null in a non-null field, a decimal beyond 64 bits.
    """
    skip = _nulls(arr)
    if skip is not None and not field.nullable:
        raise ValueError(f"field {field.name!r} is not nullable and holds a null")
    kind = field.kind
    if kind in ("int", "long"):
        return skip, [varint(zigzag(_ints(arr)), skip)]
    if kind == "boolean":
        return skip, [_fixed(arr.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8), 1, skip)]
    if kind in ("float", "double"):
        dtype, width = (np.dtype("<f4"), 4) if kind == "float" else (np.dtype("<f8"), 8)
        values = arr.fill_null(0).to_numpy(zero_copy_only=False).astype(dtype, copy=False)
        return skip, [_fixed(values, width, skip)]
    if kind in ("string", "bytes"):
        return skip, _binary(arr, skip)
    if kind == "decimal":
        return skip, _decimal(arr, field, skip)
    raise ColumnarUnsupported(f"field {field.name!r}: kind {kind}")  # pragma: no cover - refused in __init__


def assemble(rows: int, pieces: Sequence[Piece]) -> list[bytes]:
    """Lay the pieces of each row side by side and cut the rows into ``bytes``."""
    lens = np.zeros(rows, dtype=np.int64)
    for lengths, _ in pieces:
        lens += lengths
    ends = np.cumsum(lens)
    pos = ends - lens
    out = np.empty(int(ends[-1]) if rows else 0, dtype=np.uint8)
    for lengths, data in pieces:
        if isinstance(lengths, (int, np.integer)):
            if lengths:
                out[(pos[:, None] + np.arange(lengths)).ravel()] = data
        elif data.size:
            src = np.cumsum(lengths) - lengths
            out[np.repeat(pos - src, lengths) + np.arange(data.size)] = data
        pos += lengths
    # slicing one bytes object is faster than Arrow's to_pylist() of a binary array (no scalar object per value)
    buf = out.tobytes()
    bounds = [0, *ends.tolist()]
    return [buf[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


class ColumnarEncoder:
    """Encode the key and value of every row of an Arrow table as single-object Avro (see the module docstring).

    Args:
        value_schema: the value's Avro record schema (flat: the types listed in the module docstring).
        value_header: the value's single-object header (marker + fingerprint, 10 bytes).
        key_schema: the key's Avro record schema; each of its fields must be a value field of the same type.
        key_header: the key's single-object header.

    Raises:
        ColumnarUnsupported: a schema has a type this encoder does not write.
    """

    def __init__(
        self, value_schema: Mapping[str, Any], value_header: bytes, key_schema: Mapping[str, Any], key_header: bytes
    ):
        self.fields = _fields_of(value_schema)
        self.key_fields = _fields_of(key_schema)
        by_name = {f.name: f for f in self.fields}
        for k in self.key_fields:
            v = by_name.get(k.name)
            if v is None or (v.kind, v.scale) != (k.kind, k.scale) or k.nullable:
                raise ColumnarUnsupported(f"key field {k.name!r} is not a non-null value field of the same type")
        self.value_header = np.frombuffer(value_header, dtype=np.uint8)
        self.key_header = np.frombuffer(key_header, dtype=np.uint8)

    @property
    def arrow_schema(self) -> Any:
        """The Arrow schema of the tables :meth:`encode` takes (value fields in order, Avro names)."""
        import pyarrow as pa

        return pa.schema([pa.field(f.name, f.arrow_type, nullable=f.nullable) for f in self.fields])

    def encode(self, table: Any) -> tuple[list[bytes], list[bytes]]:
        """Keys and values of every row, in row order.

        Args:
            table: a ``pyarrow.Table`` or ``RecordBatch`` with a column per value field (by name).

        Returns:
            ``(keys, values)``: single-object encoded bytes, one of each per row.

        Raises:
            ValueError: a value this encoder cannot write (the caller encodes the batch record by record).
        """
        rows = table.num_rows
        value_pieces: list[Piece] = [(len(self.value_header), np.tile(self.value_header, rows))]
        by_name: dict[str, list[Piece]] = {}
        for f in self.fields:
            column = table.column(f.name)
            arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
            skip, pieces = field_pieces(arr, f)
            by_name[f.name] = pieces
            if f.nullable:
                index = np.full(rows, 2 * f.value_branch, dtype=np.uint8)
                if skip is not None:
                    index[skip] = 2 * f.null_branch
                value_pieces.append((1, index))
            value_pieces.extend(pieces)
        key_pieces: list[Piece] = [(len(self.key_header), np.tile(self.key_header, rows))]
        for k in self.key_fields:
            key_pieces.extend(by_name[k.name])
        return assemble(rows, key_pieces), assemble(rows, value_pieces)
