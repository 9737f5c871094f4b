"""Arrow arrays made to fit an Arrow type: nested types cast field by field, and nulls under null parents filled.

What a decoded column needs before it joins a table of the :mod:`schemas.arrow` types (:mod:`schemas.columnar`
decodes with polars, whose nested types differ), and before a Parquet writer takes it
(:func:`null_rows_filled`: required fields of an optional record hold a value where the record is null).
"""

from __future__ import annotations

from typing import Any


def conform(array: Any, target: Any) -> Any:
    """Cast an Arrow array to ``target``, nested types field by field.

    ``pyarrow``'s cast refuses a struct whose non-nullable child holds nulls under
    null parents (what a reader produces for ``["null", record]``); structs are
    therefore rebuilt from their conformed children with the parent's validity.

    Args:
        array: a ``pyarrow.Array`` or ``ChunkedArray``.
        target: the ``pyarrow.DataType`` wanted.

    Returns:
        An array of type ``target``.

    Raises:
        pyarrow.ArrowInvalid: a value does not fit (never for the reader's own types).
    """
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([conform(c, target) for c in array.chunks], type=target)
    if array.type == target:
        return array
    if pa.types.is_struct(target):
        children = []
        for i, f in enumerate(target):
            child = conform(array.field(i), f.type)
            if not f.nullable and child.null_count:
                child = _filled(child, f.type)  # only under null parents: what Arrow's from_pylist puts there
            children.append(child)
        mask = array.is_null() if array.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if (pa.types.is_list(target) or pa.types.is_large_list(target)) and _has_struct(target.value_type):
        values = conform(array.flatten(), target.value_type)
        offsets = _rebased(array.offsets)
        mask = array.is_null() if array.null_count else None
        return pa.ListArray.from_arrays(offsets.cast(pa.int32()), values, type=target, mask=mask)
    return array.cast(target)


def null_rows_filled(array: Any) -> Any:
    """A struct array whose null rows hold zeros in their required fields (Parquet's writer wants that).

    ``take`` with null indices (a tombstone's row) gives null structs whose children
    are null too, required ones included; Arrow's ``from_pylist`` puts zeros there.

    Args:
        array: a ``pyarrow.StructArray``.

    Returns:
        The same rows, nulls kept at the struct level.
    """
    import pyarrow as pa

    if not array.null_count and not _rebuilt_nulls(array):
        return array  # conform() already filled what is under a null optional record
    kids = []
    for i, f in enumerate(array.type):
        child = array.field(i)
        if pa.types.is_struct(f.type):
            child = null_rows_filled(child)  # an optional record's own required fields, where it is null
        if not f.nullable and child.null_count:
            child = _filled(child, f.type)
        kids.append(child)
    return pa.StructArray.from_arrays(kids, fields=list(array.type), mask=array.is_null() if array.null_count else None)


def _rebuilt_nulls(array: Any) -> bool:
    """Whether a required child of ``array`` holds a null (``take`` with null indices puts them there)."""
    return any(not f.nullable and array.field(i).null_count for i, f in enumerate(array.type))


def _filled(array: Any, typ: Any) -> Any:
    """``array`` without nulls: each null becomes its type's zero (0, "", b"", [], a struct of zeros).

    A required child of an optional record is null where the record is; Parquet's
    writer refuses nulls in a required column even there, and Arrow's own
    ``from_pylist`` stores zeros in those slots.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if array.null_count == 0:
        return array
    if pa.types.is_struct(typ):
        kids = [
            _filled(array.field(i), f.type)
            if not f.nullable
            else null_rows_filled(array.field(i))
            if pa.types.is_struct(f.type)
            else array.field(i)
            for i, f in enumerate(typ)
        ]
        return pa.StructArray.from_arrays(kids, fields=list(typ))
    return pc.fill_null(array, pa.scalar(_zero(typ), typ))


def _zero(typ: Any) -> Any:
    import decimal

    import pyarrow as pa

    if pa.types.is_boolean(typ):
        return False
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return ""
    if pa.types.is_fixed_size_binary(typ):
        return bytes(typ.byte_width)
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return b""
    if pa.types.is_decimal(typ):
        return decimal.Decimal(0)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_map(typ):
        return []
    return 0  # numbers, timestamps, dates, times: their epoch


def _has_struct(typ: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_struct(typ):
        return True
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return _has_struct(typ.value_type)
    return False


def _rebased(offsets: Any) -> Any:
    """List offsets rebased to start at 0 (``flatten()`` drops the values before a slice's first list)."""
    import pyarrow.compute as pc

    first = offsets[0].as_py() if len(offsets) else 0
    return pc.subtract(offsets, first) if first else offsets
