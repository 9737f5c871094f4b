"""Whether an update's values fit the RDS sink's target columns exactly: never a rounded value.

A database stores what it is given *converted to the column's type*, and
several conversions lose data without an error: PostgreSQL and MariaDB round
``1.2345`` to ``1.23`` in a ``numeric(12,2)`` column (the SQL standard's
"assignment" rule for exact numerics), MariaDB outside strict mode truncates a
long string. The update topic's writer schema says what its values can be, so
the sink compares each writer schema with the table's columns **once per writer
schema version** (:func:`plan_fit`) and learns which fields may not fit:

* an Avro ``decimal(p, s)`` into ``numeric(p', s')`` with ``s > s'`` (a value
  with more fractional digits) or ``p - s > p' - s'`` (more integer digits);
* an Avro ``int``/``long``/``decimal`` into a smaller integer column, or an
  integer into a ``numeric`` with fewer integer digits;
* an Avro ``string`` into a ``varchar(n)``/``char(n)``.

Only those fields' values are then checked, in Arrow columns
(:func:`misfits`: ``round``/``abs``/``utf8_length`` of :mod:`pyarrow.compute`),
and a record with a value the column cannot hold exactly is a record error (dead
letter queue) naming the field, the column's SQL type and the record's Avro
type. With ``evolve_table: true`` a narrower ``numeric`` column is widened
instead (:attr:`FitPlan.widen`), before anything is written.

A field of the writer schema the table has no column for is listed in
:attr:`FitPlan.add`; with ``evolve_table: true`` the sink adds the column (as
Kafka Connect's JDBC sink does with ``auto.evolve``), else every record of that
writer schema blocks the sink (a target error, see :mod:`sync_service.isolation`).

Avro ``float``/``double`` values into a ``numeric`` column are not checked
(binary floating point has no exact decimal scale to compare).

A field whose Avro type the column's SQL type cannot take at all (a ``string``
field into a ``BIGINT`` column, a ``long`` into a ``DATE``) is listed in
:attr:`FitPlan.retyped`: ``evolve_table`` changes no column's type, and the sink
then blocks with an error naming the column and the schemas.

A column the writer schema does not carry receives NULL on every upsert
(the sink writes whole rows); when the column is required (``NOT NULL``, or
created by the sink from a required Avro field, see
:data:`REQUIRED_COMMENT`) the plan lists it in :attr:`FitPlan.absent_required`
and the sink logs a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sqlalchemy import Numeric, Table
from sqlalchemy import types as sqltypes

from schemas.serde import non_null_type

REQUIRED_COMMENT = "threes: required (non-null) field of the Avro schema this column was created from"
"""The comment ``create_table`` puts on a column made from a non-nullable Avro field (columns are created
nullable so that a field removed by a compatible schema change still writes): how a restarted sink
knows the column was required."""

MAX_PRECISION = {"postgresql": (1000, 1000), "mysql": (65, 30), "mariadb": (65, 38)}
"""``(precision, scale)`` limits of ``numeric``/``DECIMAL`` per dialect (PostgreSQL "Arbitrary Precision
Numbers"; MySQL "Fixed-Point Types"; MariaDB "DECIMAL"): a column is widened only within them."""

_INT_BITS = {"TINYINT": 8, "SMALLINT": 16, "SMALLINTEGER": 16, "MEDIUMINT": 24, "BIGINT": 64, "BIGINTEGER": 64}


@dataclass(frozen=True)
class FieldCheck:
    """One field whose values may not fit its column: the bounds the column holds exactly.

    Attributes:
        field: the Avro field (= column) name.
        sql_type: the column's SQL type as the dialect writes it (``NUMERIC(12, 2)``).
        avro_type: the field's Avro type (``decimal(12,4)``, ``long``, ``string``).
        scale: fractional digits the column keeps (0 for an integer column), ``None``: not checked.
        int_digits: integer digits the column keeps (``numeric(p, s)``: ``p - s``), ``None``: not checked.
        lo: the smallest integer the column holds, ``None``: not checked.
        hi: the largest integer the column holds, ``None``: not checked.
        max_length: characters the column holds, ``None``: not checked.
        nullable: whether the Avro field is a union with null.
    """

    field: str
    sql_type: str
    avro_type: str
    scale: int | None = None
    int_digits: int | None = None
    lo: int | None = None
    hi: int | None = None
    max_length: int | None = None
    nullable: bool = False

    def reason(self) -> str:
        """Why a value of this field was refused (for the dead letter queue)."""
        numeric = self.max_length is None  # evolve_table widens numeric columns, never a varchar
        fix = ("widen the column (or set evolve_table: true on the sink to widen numeric columns)" if numeric
               else "widen the column (ALTER TABLE ... TYPE); evolve_table widens numeric columns only")
        return (
            f"field {self.field!r} (Avro type {self.avro_type}) has a value that column {self.field!r} "
            f"({self.sql_type}) cannot hold exactly; the sink never rounds or truncates: {fix}"
        )


@dataclass(frozen=True)
class NewField:
    """A field of the writer schema the table has no column for (``evolve_table`` adds one).

    Attributes:
        name: the Avro field (= new column) name.
        avro_type: the field's Avro type as the schema declares it (a name, a dict or a union list).
        nullable: whether the type is a union with null.
        has_default: whether the field declares a ``default`` (Avro schema resolution fills it
            for records written without the field: the value existing rows get).
        default: the declared default (``None`` when there is none, or when it is null).
    """

    name: str
    avro_type: Any
    nullable: bool
    has_default: bool = False
    default: Any = None


@dataclass(frozen=True)
class Retyped:
    """A field whose Avro type its column cannot take (a type change of the writer schema).

    Attributes:
        field: the Avro field (= column) name.
        sql_type: the column's SQL type as the dialect writes it.
        avro_type: the field's Avro type family (``string``, ``integer``, ``timestamp``...).
    """

    field: str
    sql_type: str
    avro_type: str


@dataclass
class FitPlan:
    """What one writer schema needs against one table (see :func:`plan_fit`).

    Attributes:
        checks: fields whose values must be checked before writing.
        widen: ``(column, wider numeric type)`` that ``evolve_table`` may apply instead of checking.
        absent_required: required columns the writer schema has no field for (NULL is written).
        absent: every column (key and version columns aside) the writer schema has no field for.
        add: fields of the writer schema the table has no column for, in schema order.
        retyped: fields whose Avro type their column's SQL type cannot take.
    """

    checks: list[FieldCheck] = field(default_factory=list)
    widen: list[tuple[str, Numeric]] = field(default_factory=list)
    absent_required: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    add: list[NewField] = field(default_factory=list)
    retyped: list[Retyped] = field(default_factory=list)


def _avro_numeric(avro: Any) -> tuple[str, int, int, int, int] | None:
    """``(name, precision, scale, lo, hi)`` of an Avro ``int``/``long``/``decimal``; ``None`` for other types."""
    if isinstance(avro, dict):
        if avro.get("logicalType") == "decimal" and avro.get("type") in ("bytes", "fixed"):
            p, s = int(avro.get("precision", 38)), int(avro.get("scale", 0))
            top = 10 ** (p - s)
            return f"decimal({p},{s})", p, s, -top, top
        if avro.get("logicalType") is None:
            return _avro_numeric(avro.get("type"))
        return None
    if avro == "int":
        return "int", 10, 0, -(2**31), 2**31 - 1
    if avro == "long":
        return "long", 19, 0, -(2**63), 2**63 - 1
    return None


def _is_string(avro: Any) -> bool:
    if isinstance(avro, dict):
        return avro.get("type") == "string" or avro.get("type") == "enum"
    return avro == "string"


_AVRO_FAMILIES = {"boolean": "boolean", "int": "integer", "long": "integer", "float": "float", "double": "float",
                  "bytes": "binary", "string": "string"}
_LOGICAL_FAMILIES = {"decimal": "decimal", "date": "date", "time-millis": "time", "time-micros": "time",
                     "timestamp-millis": "timestamp", "timestamp-micros": "timestamp", "timestamp-nanos": "timestamp",
                     "local-timestamp-millis": "timestamp", "local-timestamp-micros": "timestamp",
                     "local-timestamp-nanos": "timestamp", "uuid": "uuid"}
# which column families take a field's values (what the sink's writes and the databases' assignment casts accept)
_TAKES = {
    "boolean": {"boolean", "integer"},  # MySQL's BOOLEAN is TINYINT(1)
    "integer": {"integer", "decimal", "float"},
    "float": {"float", "decimal"},
    "decimal": {"decimal", "float"},
    "string": {"string", "json", "uuid", "date", "time", "timestamp"},  # text the database parses
    "uuid": {"uuid", "string"},
    "binary": {"binary"},
    "date": {"date", "timestamp"},
    "time": {"time"},
    "timestamp": {"timestamp"},
    "json": {"json", "string"},
}


def _avro_family(avro: Any) -> str | None:
    """The kind of value an Avro type holds (a key of ``_TAKES``); ``None``: not judged (a union, a named ref)."""
    if isinstance(avro, dict):
        logical = avro.get("logicalType")
        if logical is not None:
            return _LOGICAL_FAMILIES.get(logical)
        kind = avro.get("type")
        if kind in ("record", "map", "array"):
            return "json"
        if kind == "enum":
            return "string"
        if kind == "fixed":
            return "binary"
        return _avro_family(kind)
    return _AVRO_FAMILIES.get(avro) if isinstance(avro, str) else None


def _column_family(t: sqltypes.TypeEngine) -> str | None:
    """The kind of value a reflected column type holds; ``None``: not judged (intervals, arrays, geometry...)."""
    for cls, family in ((sqltypes.Boolean, "boolean"), (sqltypes.Integer, "integer"), (sqltypes.Float, "float"),
                        (sqltypes.Numeric, "decimal"), (sqltypes.JSON, "json"), (sqltypes.Uuid, "uuid"),
                        (sqltypes.String, "string"), (sqltypes._Binary, "binary"), (sqltypes.DateTime, "timestamp"),
                        (sqltypes.Date, "date"), (sqltypes.Time, "time")):
        if isinstance(t, cls):
            return family
    return None


def _integer_range(t: sqltypes.TypeEngine) -> tuple[int, int]:
    name = type(t).__name__.upper()
    bits = _INT_BITS.get(name, 64 if isinstance(t, sqltypes.BigInteger) else 16
                         if isinstance(t, sqltypes.SmallInteger) else 32)
    if getattr(t, "unsigned", False):
        return 0, 2**bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def plan_fit(
    schema: dict[str, Any],
    table: Table,
    dialect: Any,
    *,
    skip: set[str] | frozenset[str] = frozenset(),
    required_fields: set[str] | frozenset[str] = frozenset(),
) -> FitPlan:
    """Compare a writer schema with the table's columns (once per writer schema version).

    Args:
        schema: the Avro record schema of the update values (parsed JSON or fastavro's parsed form).
        table: the reflected target table.
        dialect: the engine's SQLAlchemy dialect (renders SQL types; bounds the widening).
        skip: columns filled by the sink, not by the value (key, version column).
        required_fields: fields that earlier writer schemas of the topic declared non-null: their
            column counts as required when this schema drops them.

    Returns:
        The :class:`FitPlan`. Pure: no I/O.
    """
    fields = {f["name"]: f for f in schema.get("fields", [])}
    plan = FitPlan()
    max_p, max_s = MAX_PRECISION.get(dialect.name, (0, 0))
    for column in table.c:
        f = fields.get(column.name)
        if column.name in skip:
            continue
        if f is None:
            plan.absent.append(column.name)
            not_null = not column.nullable and column.server_default is None
            if not_null or column.name in required_fields or column.comment == REQUIRED_COMMENT:
                plan.absent_required.append(column.name)
            continue
        avro, nullable = non_null_type(f["type"])
        t = column.type
        sql = str(t.compile(dialect=dialect))
        family, takes = _avro_family(avro), _column_family(t)
        if family is not None and takes is not None and takes not in _TAKES[family]:
            plan.retyped.append(Retyped(column.name, sql, family))
            continue
        source = _avro_numeric(avro)
        if source is not None and isinstance(t, sqltypes.Integer):
            name, _p, s, lo, hi = source
            c_lo, c_hi = _integer_range(t)
            if s > 0 or lo < c_lo or hi > c_hi:
                plan.checks.append(FieldCheck(column.name, sql, name, scale=0, lo=c_lo, hi=c_hi, nullable=nullable))
        elif source is not None and isinstance(t, sqltypes.Numeric) and not isinstance(t, sqltypes.Float):
            _fit_numeric(plan, column.name, t, sql, source, nullable, (max_p, max_s))
        elif _is_string(avro) and isinstance(t, sqltypes.String) and t.length:
            plan.checks.append(FieldCheck(column.name, sql, "string", max_length=t.length, nullable=nullable))
    for name, f in fields.items():
        if name not in table.c and name not in skip:
            nullable = non_null_type(f["type"])[1]
            plan.add.append(NewField(name, f["type"], nullable, "default" in f, f.get("default")))
    return plan


def _fit_numeric(
    plan: FitPlan, column: str, t: Any, sql: str, source: tuple[str, int, int, int, int], nullable: bool,
    widest: tuple[int, int],
) -> None:
    """:func:`plan_fit` for a numeric field (``source``: ``_avro_numeric``'s) into column ``t``, ``numeric(p, s)``.

    Adds a check where the field's values may not fit, and the widening when it stays within ``widest``
    (the dialect's largest ``(precision, scale)``).
    """
    if t.precision is None:
        return  # PostgreSQL's unbounded numeric holds any decimal exactly
    name, p, s, _lo, _hi = source
    c_p, c_s = int(t.precision), int(t.scale or 0)
    if s <= c_s and p - s <= c_p - c_s:
        return
    plan.checks.append(FieldCheck(column, sql, name, scale=c_s if s > c_s else None,
                                  int_digits=c_p - c_s if p - s > c_p - c_s else None, nullable=nullable))
    wide_s = max(s, c_s)
    wide_p = max(p - s, c_p - c_s) + wide_s
    if wide_p <= widest[0] and wide_s <= widest[1]:
        plan.widen.append((column, Numeric(wide_p, wide_s)))


def required_fields_of(schema: dict[str, Any]) -> set[str]:
    """The fields of a record schema that are not a union with null (a value is always there)."""
    return {f["name"] for f in schema.get("fields", []) if not non_null_type(f["type"])[1]}


def misfits(values: Any, check: FieldCheck) -> Any:
    """Which values do not fit the column exactly, computed on the whole column.

    Args:
        values: a ``pyarrow`` array or chunked array of the field (decimal, integer or string).
        check: the column's bounds.

    Returns:
        A ``pyarrow`` boolean array of the same length: ``True`` where the value
        does not fit (nulls fit: nullability is the database's to check).

    Raises:
        TypeError: ``values`` has a type this check does not handle.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    typ = values.type
    bad = pa.array(np.zeros(len(values), dtype=bool))
    if check.max_length is not None:
        if not (pa.types.is_string(typ) or pa.types.is_large_string(typ)):
            raise TypeError(f"field {check.field!r}: a length check needs strings, got {typ}")
        return pc.fill_null(pc.greater(pc.utf8_length(values), check.max_length), False)
    if pa.types.is_decimal(typ):
        if check.scale is not None and typ.scale > check.scale:
            # one more digit of precision: rounding 99.995 to 100.00 must not overflow the type
            wide = (pa.decimal128 if typ.precision < 38 else pa.decimal256)(typ.precision + 1, typ.scale)
            widened = pc.cast(values, wide)
            bad = pc.or_(bad, pc.not_equal(pc.round(widened, ndigits=check.scale), widened))
        if check.int_digits is not None:
            top = Decimal(10) ** check.int_digits
            limit = pa.scalar(top, pa.decimal256(check.int_digits + 1, 0) if check.int_digits >= 38
                              else pa.decimal128(check.int_digits + 1, 0))
            bad = pc.or_(bad, pc.greater_equal(pc.abs(values), limit))
    elif pa.types.is_integer(typ):
        if check.int_digits is not None and 10**check.int_digits <= 2**63 - 1:
            top = 10**check.int_digits
            bad = pc.or_(bad, pc.or_(pc.less_equal(values, -top), pc.greater_equal(values, top)))
    elif not pa.types.is_null(typ):
        raise TypeError(f"field {check.field!r}: a numeric check needs decimals or integers, got {typ}")
    if check.lo is not None and check.hi is not None and not pa.types.is_null(typ):
        lo, hi = (Decimal(check.lo), Decimal(check.hi)) if pa.types.is_decimal(typ) else (check.lo, check.hi)
        if pa.types.is_integer(typ):
            info = _int_bounds(typ)
            lo, hi = max(lo, info[0]), min(hi, info[1])  # a scalar out of the array's type cannot be compared
        bad = pc.or_(bad, pc.or_(pc.less(values, pa.scalar(lo)), pc.greater(values, pa.scalar(hi))))
    return pc.fill_null(bad, False)


def _int_bounds(typ: Any) -> tuple[int, int]:
    import numpy as np

    info = np.iinfo(typ.to_pandas_dtype())
    return int(info.min), int(info.max)


def arrow_type(schema: dict[str, Any], name: str) -> Any:
    """The Arrow type of field ``name``'s values (for checking values decoded per record); ``None``: infer."""
    import pyarrow as pa

    for f in schema.get("fields", []):
        if f["name"] == name:
            avro, _ = non_null_type(f["type"])
            source = _avro_numeric(avro)
            if source is not None and source[0].startswith("decimal"):
                p, s = source[1], source[2]
                return pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)
            if source is not None:
                return pa.int64()
            if _is_string(avro):
                return pa.string()
    return None
