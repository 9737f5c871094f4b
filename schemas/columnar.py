"""Columnar decoding: many single-object Avro bodies of one writer schema into one Arrow table.

A consumer that handles records in batches should not pay one fastavro call and
one Python dict per record. The bodies of one
writer schema are instead wrapped in **one Avro object container block** (the
Avro 1.x specification, "Object Container Files": a header with the schema and
a sync marker, then ``count``, ``size``, the concatenated bodies and the sync
marker) and read by polars' Avro reader in one call (many times fastavro's
records/s, see ``benchmarks/sync_sinks.py``). The result is converted to the
Arrow types of :mod:`schemas.arrow` (the mapping of Spark's ``spark-avro``), so a
column has the same type whatever its values.

Safety, because a block spoils as a whole:

* Avro bodies carry no lengths, so a body with trailing bytes would shift every
  later record of the block. Each body is therefore followed by its row number,
  read back as an extra trailing field ``__threes_row`` of a wrapper record; a
  block whose row numbers are not exactly ``0..n-1`` raises
  :class:`ColumnarDecodeError`, and the caller decodes that block record by
  record (fastavro) to find the bad body, which goes to the dead letter queue.
* Whether a writer schema can be decoded this way is decided once per
  fingerprint (:meth:`ColumnarDecoder.supports`): a top-level record whose
  types all have a faithful Arrow type (no map, which polars 2.1 cannot read,
  no union of several non-null types, no recursion, no field
  of type ``null`` alone). Other schemas take the
  per-record path, always.
* polars raises ``pyo3_runtime.PanicException`` (a ``BaseException``) on input
  it cannot handle; that is caught and reported as :class:`ColumnarDecodeError`.

The wire format is unchanged: this module only reads the bodies of
:mod:`schemas.serde`'s single-object encoding.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

import fastavro

from schemas.arrow_conform import conform
from schemas.exceptions import SerdeError

log = logging.getLogger(__name__)

ROW_FIELD = "__threes_row"
_SYNC = b"threes-columnar!"  # 16 bytes: the block's sync marker (any value does, it is ours)
_HEADER_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "org.apache.avro.file.Header",
        "fields": [
            {"name": "magic", "type": {"type": "fixed", "name": "Magic", "size": 4}},
            {"name": "meta", "type": {"type": "map", "values": "bytes"}},
            {"name": "sync", "type": {"type": "fixed", "name": "Sync", "size": 16}},
        ],
    }
)


class ColumnarDecodeError(SerdeError):
    """A block of bodies did not decode as a whole (a bad body, or input the reader cannot handle)."""


def _zigzag(n: int) -> bytes:
    """Avro's variable-length zig-zag encoding of a long."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_ROW_BYTES = [_zigzag(i) for i in range(16384)]


def _python_objects(column: Any) -> list[Any]:
    """``column.to_pylist()``, faster for columns (and records) of ints, floats, bools and strings.

    pyarrow's ``to_pylist`` makes a scalar object per value (and per field of a
    record); numpy's ``tolist`` gives the same Python objects in one call, and a
    record becomes a dict zipped from its fields' lists.

    Args:
        column: a ``pyarrow.ChunkedArray``.

    Returns:
        One Python object per row, equal to ``to_pylist()``'s.
    """
    import pyarrow as pa

    if column.null_count == 0:
        if _numpy_exact(column.type):
            return list(column.to_numpy().tolist())
        if pa.types.is_struct(column.type) and all(_numpy_exact(f.type) for f in column.type):
            fields = column.combine_chunks().flatten()
            if all(f.null_count == 0 for f in fields):
                names = [f.name for f in column.type]
                lists = [f.to_numpy(zero_copy_only=False).tolist() for f in fields]
                return [dict(zip(names, row, strict=True)) for row in zip(*lists, strict=True)]
    return list(column.to_pylist())


def _numpy_exact(arrow_type: Any) -> bool:
    """Whether ``to_numpy().tolist()`` gives exactly ``to_pylist()``'s objects for a column without nulls."""
    import pyarrow as pa

    t = pa.types
    return bool(t.is_integer(arrow_type) or t.is_floating(arrow_type) or t.is_boolean(arrow_type) or t.is_string(
        arrow_type
    ) or t.is_large_string(arrow_type))


def _row_numbers(n: int) -> list[bytes]:
    """The Avro ``long`` encodings of ``0 .. n-1`` (each row's ``__row`` field), as ``bytes`` each.

    The first 16,384 come from a table made once; the rest are computed with numpy, a run of
    equal encoded length at a time (a long ``i >= 0`` zig-zags to ``2 * i``, written 7 bits
    a byte, low bits first, the high bit set on every byte but the last), then cut from one
    buffer: one :func:`_zigzag` call per row beyond the table would be a Python call per row of a
    large block (the S3 sink's), twice, for its keys and its values.
    """
    if n <= len(_ROW_BYTES):
        return _ROW_BYTES
    import numpy as np

    out = list(_ROW_BYTES)
    start = len(_ROW_BYTES)
    while start < n:
        width = ((2 * start).bit_length() + 6) // 7  # bytes of the encoding of 2 * start
        stop = min(n, 1 << (7 * width - 1))  # first i whose 2 * i needs one more byte
        doubled = np.arange(start, stop, dtype=np.uint64) * np.uint64(2)
        encoded = np.empty((stop - start, width), dtype=np.uint8)
        for k in range(width):
            encoded[:, k] = (doubled >> np.uint64(7 * k)) & np.uint64(0x7F)
        encoded[:, : width - 1] |= 0x80
        flat = encoded.tobytes()
        out += [flat[i : i + width] for i in range(0, len(flat), width)]
        start = stop
    return out


class ColumnarDecoder:
    """Decode bodies of one writer schema into an Arrow table; per-fingerprint decisions cached.

    Thread-safe (the sync service decodes in several worker threads).

    Args:
        resolver: gives the writer schema JSON of a fingerprint (``get_json``) and
            its parsed form (``get``): a :class:`~schemas.store.SchemaStore`.
    """

    def __init__(self, resolver: Any):
        self.resolver = resolver
        self._plans: dict[bytes, tuple[bytes, Any] | None] = {}
        self._wrapped: dict[bytes, tuple[bytes, Any] | None] = {}
        self._lock = threading.Lock()

    def supports(self, fingerprint: bytes) -> bool:
        """Whether bodies of this writer schema are decoded columnar (decided once per fingerprint).

        Raises:
            UnknownSchemaError: the fingerprint is not registered.
        """
        return self._plan(fingerprint) is not None

    def _plan(self, fingerprint: bytes) -> tuple[bytes, Any] | None:
        return self._cached(self._plans, fingerprint, False)

    def _cached(
        self, plans: dict[bytes, tuple[bytes, Any] | None], fingerprint: bytes, wrapped: bool
    ) -> tuple[bytes, Any] | None:
        """The plan of a writer schema, made once per fingerprint (``None``: decode per record).

        ``wrapped``: the schema inside a one-field record (any schema, for keys);
        otherwise the schema itself, which must be a record (values).

        Raises:
            UnknownSchemaError: the fingerprint is not registered.
        """
        if fingerprint in plans:
            return plans[fingerprint]
        parsed = self.resolver.get(fingerprint)  # UnknownSchemaError propagates
        plan = None
        try:
            schema = json.loads(self.resolver.get_json(fingerprint))
            if wrapped:
                from schemas.arrow import has_uuid

                if has_uuid(schema):
                    raise ValueError("a uuid logical type (fastavro decodes it as uuid.UUID)")
                wrapper = [{"name": "v", "type": schema}]
                schema = {"type": "record", "name": "threes_columnar_wrapper", "fields": wrapper}
                parsed = {"type": "record", "name": "w", "fields": [{"name": "v", "type": parsed}]}
            plan = self._make_plan(schema, parsed)
        except Exception as exc:  # any reason means "per record", logged once
            log.info("writer schema %s%s decoded per record (%s)", fingerprint.hex(), " (wrapped)" if wrapped else "",
                     exc)
        with self._lock:
            plans[fingerprint] = plan
        return plan

    def decode_objects(self, fingerprint: bytes, bodies: Sequence[bytes | memoryview]) -> list[Any] | None:
        """Decode bodies of any writer schema (a key: ``long``, ``string``, a record) into Python objects.

        The schema is wrapped in a one-field record, read in columns, and converted
        with ``to_pylist`` in one call: the same objects fastavro gives (a record as
        a dict, a decimal as ``Decimal``, a timestamp as an aware ``datetime``).

        Returns:
            One object per body, in order; ``None`` when this schema is not read in
            columns (it has a ``uuid``, which fastavro gives as ``uuid.UUID``, or a type
            polars cannot read): decode per record then.

        Raises:
            ColumnarDecodeError: the block did not decode (decode per record to find the bad body).
        """
        plan = self._cached(self._wrapped, fingerprint, True)
        if plan is None:
            return None
        column = self._read(fingerprint, plan, bodies).column(0)
        return _python_objects(column)

    @staticmethod
    def _make_plan(schema: dict[str, Any], parsed: Any) -> tuple[bytes, Any]:
        import pyarrow as pa

        from schemas.arrow import UnsupportedAvroType, arrow_type

        if not isinstance(schema, dict) or schema.get("type") != "record":
            raise UnsupportedAvroType("the value is not a record")
        _reject_unreadable(schema)
        struct = arrow_type(parsed)
        wrapper = _without_defaults(schema)
        wrapper["fields"] = [*wrapper["fields"], {"name": ROW_FIELD, "type": "long"}]
        header = io.BytesIO()
        fastavro.schemaless_writer(
            header,
            _HEADER_SCHEMA,
            {
                "magic": b"Obj\x01",
                "meta": {"avro.schema": json.dumps(wrapper).encode(), "avro.codec": b"null"},
                "sync": _SYNC,
            },
        )
        return header.getvalue(), pa.schema(list(struct))

    def decode(self, fingerprint: bytes, bodies: Sequence[bytes | memoryview]) -> Any:
        """Decode ``bodies`` (Avro binary, no single-object header) written with one writer schema.

        Args:
            fingerprint: the writer schema's fingerprint (:meth:`supports` must be true).
            bodies: the bodies, in the order the rows should have.

        Returns:
            A ``pyarrow.Table`` with one row per body, in order, typed as :mod:`schemas.arrow` maps the schema.

        Raises:
            ColumnarDecodeError: the block did not decode, or its rows are misaligned (a bad body);
                decode the bodies one by one to find it.
        """
        plan = self._plan(fingerprint)
        if plan is None:
            raise ColumnarDecodeError(f"writer schema {fingerprint.hex()} is not decoded columnar")
        return self._read(fingerprint, plan, bodies)

    @staticmethod
    def _read(fingerprint: bytes, plan: tuple[bytes, Any], bodies: Sequence[bytes | memoryview]) -> Any:
        """One container block of ``bodies`` read by polars, checked, conformed to the plan's Arrow schema."""
        import numpy as np
        import polars as pl
        import pyarrow as pa

        header, schema = plan
        if not bodies:
            return schema.empty_table()
        rows = _row_numbers(len(bodies))
        # each body, then its row number (the row list may be longer than the bodies)
        data = b"".join(itertools.chain.from_iterable(zip(bodies, rows, strict=False)))
        block = b"".join((header, _zigzag(len(bodies)), _zigzag(len(data)), data, _SYNC))
        try:
            table = pl.read_avro(io.BytesIO(block)).to_arrow()
        except Exception as exc:
            raise ColumnarDecodeError(f"block of {len(bodies)} bodies of {fingerprint.hex()}: {exc}") from exc
        except BaseException as exc:  # pyo3's PanicException derives from BaseException
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise ColumnarDecodeError(
                f"block of {len(bodies)} bodies of {fingerprint.hex()}: reader panic: {exc}"
            ) from exc
        rows = table.column(ROW_FIELD)
        if table.num_rows != len(bodies) or not np.array_equal(rows.to_numpy(), np.arange(len(bodies))):
            raise ColumnarDecodeError(
                f"block of {len(bodies)} bodies of {fingerprint.hex()}: rows misaligned (a body has extra or missing "
                "bytes)"
            )
        columns = [conform(table.column(f.name), f.type) for f in schema]
        return pa.Table.from_arrays(columns, schema=schema)


def _without_defaults(schema: Any) -> Any:
    """A copy of ``schema`` without ``default`` attributes (of fields and enums).

    polars 2.1's Avro reader refuses a block whose schema has a non-null field default
    (``avro-error: OutOfSpec``, seen with ``{"type": "int", "default": 7}``); defaults only
    matter when a reader schema resolves a writer's, and the block is read with its own writer
    schema, so dropping them changes no value.
    """
    if isinstance(schema, dict):
        return {k: _without_defaults(v) for k, v in schema.items() if k != "default"}
    if isinstance(schema, list):
        return [_without_defaults(v) for v in schema]
    return schema


def _reject_unreadable(schema: Any, in_union: bool = False) -> None:
    """Raise for what polars 2.1's Avro reader cannot read: a map, a field of type ``null`` alone."""
    from schemas.arrow import UnsupportedAvroType

    if schema == "null" and not in_union:
        raise UnsupportedAvroType("a field of type null (polars' Avro reader cannot read it)")
    if isinstance(schema, dict):
        if schema.get("type") == "map":
            raise UnsupportedAvroType("an Avro map (polars' Avro reader cannot read maps)")
        for key in ("type", "items", "values"):
            if key in schema:
                _reject_unreadable(schema[key])
        for f in schema.get("fields", ()):
            _reject_unreadable(f["type"])
    elif isinstance(schema, list):
        for branch in schema:
            _reject_unreadable(branch, in_union=True)
