"""Spark SQL expressions in the YAML: parsed and type-checked without a JVM, run as Catalyst columns.

``where``, ``derive`` and ``delete_when`` take expressions in Spark SQL's dialect, the language
PySpark users already write (``price * qty``, ``to_date(ts)``, ``coalesce(a, b)``,
``status <> 'test'``). ``threes validate`` parses each with sqlglot's Spark dialect and
types it against the Avro schemas (:func:`check`): a syntax error, an unknown column or
function, arithmetic on a non-numeric operand, or a result of the wrong type (a ``where``
that is not boolean) is a config error naming the expression. At run time the same text
becomes ``pyspark.sql.functions.expr(text)``: a Catalyst expression, no Python on the hot
path; the types the job writes are Spark's own (:func:`stream_app.plan.spark_types.spark_type`), so
decimal arithmetic follows Spark's exact rules, not the checker's approximation.

Expressions run as Spark SQL does with the session's settings: Spark 4 runs in ANSI mode,
where a failed cast or a division by zero fails the micro-batch; ``try_cast``,
``try_divide``, ``try_add``... return null instead. Nulls propagate as in SQL.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

_TABLE = "__event"
_DIALECT = "spark"

AvroType = Any


class ExpressionError(ValueError):
    """An expression does not parse, names an unknown column or function, or has the wrong type."""


@dataclass(frozen=True)
class Expression:
    """A parsed Spark SQL expression.

    Attributes:
        text: the expression as written in the YAML.
        tree: sqlglot's syntax tree (Spark dialect).
        columns: the column names it reads (top-level names; ``a.b`` reads ``a``).
    """

    text: str
    tree: exp.Expr
    columns: frozenset[str]


def parse(text: str) -> Expression:
    """Parse one Spark SQL expression.

    Args:
        text: the expression (not a query): ``price * qty``.

    Returns:
        The parsed expression and the columns it reads.

    Raises:
        ExpressionError: a syntax error, an empty expression, a query, an aggregate or a window
            function (an expression here is evaluated per event).
    """
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError("an empty expression")
    try:
        tree = sqlglot.parse_one(text, read=_DIALECT)
    except ParseError as exc:
        detail = exc.errors[0]["description"] if exc.errors else str(exc)
        raise ExpressionError(f"{text!r} is not a Spark SQL expression: {detail}") from exc
    if isinstance(tree, exp.Alias):
        raise ExpressionError(f"{text!r}: no alias here (the YAML names the column)")
    if isinstance(tree, exp.Query) or tree.find(exp.Subquery, exp.Select) is not None:
        raise ExpressionError(f"{text!r}: a query is not an expression (no SELECT or subquery)")
    if tree.find(exp.Window) is not None:
        raise ExpressionError(f"{text!r}: window functions (OVER) have no meaning per event")
    if tree.find(exp.AggFunc) is not None:
        raise ExpressionError(f"{text!r}: aggregate functions belong in an aggregation update's `aggregations`")
    return Expression(text, tree, frozenset(_columns(tree)))


def _columns(tree: exp.Expr) -> set[str]:
    names: set[str] = set()
    for column in tree.find_all(exp.Column):
        parts = [p.name for p in column.parts]
        names.add(parts[0])  # a.b is field b of the struct column a
    return names


@functools.cache
def _spark_functions() -> frozenset[str]:
    """Function names Spark SQL knows that sqlglot may not (from PySpark's function list, no JVM)."""
    from pyspark.sql import functions

    return frozenset(name.lower() for name in dir(functions) if not name.startswith("_"))


def sql_type(avro_type: AvroType) -> exp.DataType:
    """The Spark SQL type of an Avro field type, as Spark's ``from_avro`` reads it.

    Args:
        avro_type: an Avro type (a name, a union, or a dict with ``logicalType``).

    Returns:
        A sqlglot data type (``UNKNOWN`` for what the checker does not model).
    """
    return exp.DataType.build(_sql_type_text(avro_type), dialect=_DIALECT)


_PRIMITIVES = {"int": "INT", "long": "BIGINT", "float": "FLOAT", "double": "DOUBLE", "boolean": "BOOLEAN",
               "string": "STRING", "bytes": "BINARY", "null": "VOID"}


UNKNOWN_MARK = "threes.sql_type"
"""An Avro attribute marking a derive column whose type the checker could not infer (``"unknown"``)."""


def is_unknown(avro_type: AvroType) -> bool:
    """Whether an Avro type is a derive column's type the checker could not infer (:func:`avro_type`)."""
    if isinstance(avro_type, list):
        rest = [b for b in avro_type if b != "null"]
        return len(rest) == 1 and is_unknown(rest[0])
    return isinstance(avro_type, dict) and avro_type.get(UNKNOWN_MARK) == "unknown"


def _sql_type_text(t: AvroType) -> str:
    if is_unknown(t):
        return "UNKNOWN"
    if isinstance(t, list):
        rest = [b for b in t if b != "null"]
        return _sql_type_text(rest[0]) if len(rest) == 1 else "UNKNOWN"
    if isinstance(t, str):
        return _PRIMITIVES.get(t, "UNKNOWN")
    if not isinstance(t, dict):
        return "UNKNOWN"
    logical = t.get("logicalType")
    if logical == "decimal":
        return f"DECIMAL({int(t['precision'])}, {int(t.get('scale', 0))})"
    if logical == "date":
        return "DATE"
    if logical in ("timestamp-millis", "timestamp-micros"):
        return "TIMESTAMP"
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        return "TIMESTAMP_NTZ"
    kind = t.get("type")
    if kind == "enum":
        return "STRING"
    if kind == "fixed":
        return "BINARY"
    if kind == "array":
        return f"ARRAY<{_sql_type_text(t['items'])}>"
    if kind == "map":
        return f"MAP<STRING, {_sql_type_text(t['values'])}>"
    if kind == "record":
        fields = ", ".join(f"{f['name']}: {_sql_type_text(f['type'])}" for f in t.get("fields", []))
        return f"STRUCT<{fields}>" if fields else "UNKNOWN"
    return _PRIMITIVES.get(kind, "UNKNOWN") if isinstance(kind, str) else "UNKNOWN"


_NUMERIC = exp.DataType.NUMERIC_TYPES
_TEMPORAL = exp.DataType.TEMPORAL_TYPES
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.IntDiv)


def type_class(dt: exp.DataType) -> str:
    """``boolean``, ``numeric``, ``string``, ``temporal``, ``binary``, ``complex`` or ``unknown``."""
    kind = dt.this
    if kind == exp.DataType.Type.BOOLEAN:
        return "boolean"
    if kind in _NUMERIC:
        return "numeric"
    if kind in exp.DataType.TEXT_TYPES:
        return "string"
    if kind in _TEMPORAL:
        return "temporal"
    if kind in (exp.DataType.Type.BINARY, exp.DataType.Type.VARBINARY):
        return "binary"
    if kind in (exp.DataType.Type.STRUCT, exp.DataType.Type.ARRAY, exp.DataType.Type.MAP):
        return "complex"
    return "unknown"


def check(expression: Expression, columns: dict[str, AvroType]) -> exp.DataType:
    """Type-check an expression against the columns available where it runs.

    Args:
        expression: from :func:`parse`.
        columns: column name -> Avro type of every column the expression may read there.

    Returns:
        The expression's result type (sqlglot's inference; ``UNKNOWN`` where it cannot tell).

    Raises:
        ExpressionError: an unknown column (the message lists the close names), an unknown
            function, or arithmetic on an operand that is not numeric (or a date/time with an
            interval).
    """
    by_lower = {name.lower(): name for name in columns}
    unknown = sorted(c for c in expression.columns if c.lower() not in by_lower)
    if unknown:
        raise ExpressionError(f"{expression.text!r}: no column {', '.join(map(repr, unknown))} here "
                              f"(have: {', '.join(sorted(columns))})")
    for fn in expression.tree.find_all(exp.Anonymous):
        if str(fn.this).lower() not in _spark_functions():
            raise ExpressionError(f"{expression.text!r}: {fn.this}() is not a Spark SQL function")
    schema: dict[str, object] = {_TABLE: {name: sql_type(t) for name, t in columns.items()}}
    select = exp.select(expression.tree.copy().as_("__result")).from_(_TABLE)
    try:
        typed = annotate_types(qualify(select, schema=schema, dialect=_DIALECT, validate_qualify_columns=True),
                               schema=schema, dialect=_DIALECT)
    except OptimizeError as exc:
        raise ExpressionError(f"{expression.text!r}: {exc}") from exc
    result = typed.selects[0]
    for node in result.find_all(*_ARITHMETIC):
        for side in (node.this, node.expression):
            kind = type_class(side.type) if side.type is not None else "unknown"
            if kind in ("string", "boolean", "binary", "complex"):
                raise ExpressionError(
                    f"{expression.text!r}: {node.key} of {side.sql(_DIALECT)} ({side.type.sql(_DIALECT)}) is not "
                    "arithmetic on numbers (cast it first)"
                )
    return result.type if result.type is not None else exp.DataType.build("UNKNOWN")


def avro_type(dt: exp.DataType) -> AvroType:
    """A nullable Avro type for a checked expression's type, as ``threes validate`` reports it.

    The job writes Spark's own result type instead (exact decimal precision); this one is for
    checks without a JVM. ``UNKNOWN`` (a function sqlglot does not type, such as
    ``timestamp_seconds``, ``xxhash64`` or ``upper``) and types not modelled here become ``string``
    marked unknown (:func:`is_unknown`):
    checks that need a column's type accept it, as Spark types it only when the job starts.
    Unmarked, it was taken for a string: ``threes validate`` refused such a column as an
    event time, a version or a number in a later expression, which the job accepted.
    """
    kind = dt.this
    t = exp.DataType.Type
    simple = {t.BOOLEAN: "boolean", t.TINYINT: "int", t.SMALLINT: "int", t.INT: "int", t.BIGINT: "long",
              t.FLOAT: "float", t.DOUBLE: "double", t.BINARY: "bytes", t.VARBINARY: "bytes"}
    if kind in simple:
        base: AvroType = simple[kind]
    elif kind == t.DECIMAL:
        params = [int(p.this.this) for p in dt.expressions] if dt.expressions else [38, 18]
        precision, scale = (params + [0])[:2]
        base = {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}
    elif kind == t.DATE:
        base = {"type": "int", "logicalType": "date"}
    elif kind in (t.TIMESTAMP, t.TIMESTAMPTZ, t.TIMESTAMPLTZ):
        base = {"type": "long", "logicalType": "timestamp-micros"}
    elif kind == t.TIMESTAMPNTZ:
        base = {"type": "long", "logicalType": "local-timestamp-micros"}
    elif type_class(dt) == "string":
        base = "string"
    else:  # UNKNOWN, or a type this mapping does not model (interval, array...): Spark's, when the job starts
        base = {"type": "string", UNKNOWN_MARK: "unknown"}
    return ["null", base]


def column(expression: Expression | str, alias: str | None = None) -> Any:
    """The expression as a Spark ``Column`` (``functions.expr``), optionally aliased."""
    from pyspark.sql import functions as f

    text = expression.text if isinstance(expression, Expression) else expression
    col = f.expr(text)
    return col.alias(alias) if alias else col
