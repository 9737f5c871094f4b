"""Avro types to Spark types and back, by Spark's own ``SchemaConverters`` (in the JVM): only with a SparkSession.

A derive column's type is what Spark's analyzer computes (:func:`spark_typer`), a transform's new
column is written as the Avro type ``to_avro`` gives its Spark type (:func:`avro_of_spark`), and
every schema of the plan gets the Spark type ``from_avro`` reads it as (:func:`spark_type`).
"""

from __future__ import annotations

import json
from typing import Any

from stream_app.avro_schemas import TIMESTAMP_MICROS
from stream_app.expressions import Expression, ExpressionError
from stream_app.plan.avro_types import decimal_type
from stream_app.plan.model import Schema, schema_of


def spark_typer(spark: Any) -> Any:
    """The Avro type of a derive column as Spark computes it (exact decimal precision), at the job's start."""

    def typer(columns: dict[str, Any], name: str, expression: Expression) -> Any:
        from pyspark.sql import functions as f

        record = {"type": "record", "name": "DeriveInput", "namespace": "threes.derive",
                  "fields": [{"name": n, "type": t} for n, t in columns.items() if t is not None]}
        frame = spark.createDataFrame([], spark_type(spark, schema_of(record)))
        try:
            result = frame.select(f.expr(expression.text).alias(name)).schema[0].dataType
        except Exception as exc:  # Spark's analyzer says what is wrong, in its words
            raise ExpressionError(f"{expression.text!r}: {str(exc).splitlines()[0]}") from exc
        return ["null", avro_of_spark(spark, result, name)]

    return typer


def avro_of_spark(spark: Any, data_type: Any, name: str) -> Any:
    """The Avro type ``to_avro`` writes a Spark type as (decimals as ``bytes``, timestamps in microseconds).

    Args:
        spark: the SparkSession (complex types are converted by Spark's own ``SchemaConverters``).
        data_type: a ``pyspark.sql.types.DataType``.
        name: the column's name (names a record type).

    Returns:
        A non-null Avro type.
    """
    from pyspark.sql import types as T

    simple = {T.BooleanType: "boolean", T.ByteType: "int", T.ShortType: "int", T.IntegerType: "int",
              T.LongType: "long", T.FloatType: "float", T.DoubleType: "double", T.StringType: "string",
              T.BinaryType: "bytes"}
    for kind, avro in simple.items():
        if isinstance(data_type, kind):
            return avro
    if isinstance(data_type, T.DecimalType):
        return decimal_type(data_type.precision, data_type.scale)
    if isinstance(data_type, T.DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(data_type, T.TimestampNTZType):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if isinstance(data_type, T.TimestampType):
        return TIMESTAMP_MICROS
    jvm = spark.sparkContext._jvm
    parsed = spark._jsparkSession.parseDataType(data_type.json())
    avro = json.loads(jvm.org.apache.spark.sql.avro.SchemaConverters.toAvroType(
        parsed, False, name, f"threes.derived.{name}").toString())
    return avro


def spark_type(spark: Any, schema: Schema) -> Any:
    """The Spark type ``from_avro`` gives this schema (Spark's own SchemaConverters, in the JVM)."""
    from pyspark.sql.types import StructType

    jvm = spark.sparkContext._jvm
    parsed = jvm.org.apache.avro.Schema.Parser().parse(schema.json)
    sql_type = jvm.org.apache.spark.sql.avro.SchemaConverters.toSqlType(parsed)
    return StructType.fromJson(json.loads(sql_type.dataType().json()))
