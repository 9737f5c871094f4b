"""The RDS sink's exactness checks (pure logic): which fields to check, and which values do not fit."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
from sqlalchemy import BigInteger, Column, Integer, MetaData, Numeric, SmallInteger, String, Table, Text
from sqlalchemy.dialects import mysql, postgresql

from connectors.rds.sink_fit import misfits, plan_fit

SCHEMA = {"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "long"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 4}},
    {"name": "same", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "n", "type": ["null", "long"], "default": None},
    {"name": "small", "type": "int"},
    {"name": "code", "type": "string"},
    {"name": "text", "type": "string"},
]}


def table() -> Table:
    return Table("t", MetaData(), Column("id", BigInteger, primary_key=True), Column("amount", Numeric(12, 2)),
                 Column("same", Numeric(14, 2)), Column("n", Integer), Column("small", SmallInteger),
                 Column("code", String(3)), Column("text", Text), Column("gone", Integer, nullable=False),
                 Column("_version", BigInteger, nullable=False))


def test_plan_checks_only_the_fields_that_may_not_fit_and_names_required_absent_columns() -> None:
    plan = plan_fit(SCHEMA, table(), postgresql.dialect(), skip={"id", "_version"})
    checks = {c.field: c for c in plan.checks}
    assert set(checks) == {"amount", "n", "small", "code"}
    assert (checks["amount"].scale, checks["amount"].int_digits) == (2, None)
    assert checks["amount"].sql_type == "NUMERIC(12, 2)" and checks["amount"].avro_type == "decimal(12,4)"
    assert (checks["n"].lo, checks["n"].hi) == (-(2**31), 2**31 - 1)
    assert checks["code"].max_length == 3
    assert [(c, (t.precision, t.scale)) for c, t in plan.widen] == [("amount", (14, 4))]
    assert plan.absent == ["gone"] and plan.absent_required == ["gone"]
    # MySQL: DECIMAL's limits bound the widening
    wide = {**SCHEMA, "fields": [{"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                                             "precision": 70, "scale": 4}}]}
    assert plan_fit(wide, table(), mysql.dialect(), skip={"id", "_version"}).widen == []


def test_misfits_are_computed_on_columns() -> None:
    plan = plan_fit(SCHEMA, table(), postgresql.dialect(), skip={"id", "_version"})
    checks = {c.field: c for c in plan.checks}
    amounts = pa.array([Decimal(v) for v in ("1.2345", "1.2300", "0.0001", "99999999.9999")] + [None],
                       pa.decimal128(12, 4))
    assert misfits(amounts, checks["amount"]).to_pylist() == [True, False, True, True, False]
    longs = pa.array([1, 2**31, -(2**31), None, 2**62], pa.int64())
    assert misfits(longs, checks["n"]).to_pylist() == [False, True, False, False, True]
    assert misfits(pa.array(["abc", "abcd", "été", None]), checks["code"]).to_pylist() == [False, True, False, False]
    assert misfits(pa.chunked_array([pa.array([40000, 5], pa.int64())]), checks["small"]).to_pylist() == [True, False]


def test_plan_lists_the_fields_the_table_has_no_column_for() -> None:
    evolved = {**SCHEMA, "fields": [*SCHEMA["fields"],
                                    {"name": "note", "type": ["null", "string"], "default": None},
                                    {"name": "qty", "type": "int", "default": 7},
                                    {"name": "weight", "type": "long"}]}
    plan = plan_fit(evolved, table(), postgresql.dialect(), skip={"id", "_version"})
    assert [(f.name, f.nullable, f.has_default, f.default) for f in plan.add] == [
        ("note", True, True, None), ("qty", False, True, 7), ("weight", False, False, None)]
    assert plan_fit(SCHEMA, table(), postgresql.dialect(), skip={"id", "_version"}).add == []


def test_plan_names_fields_whose_type_their_column_cannot_take() -> None:
    from sqlalchemy import JSON, Date, DateTime

    t = Table("t", MetaData(), Column("id", BigInteger, primary_key=True), Column("n", BigInteger),
              Column("d", Date), Column("s", Text), Column("j", JSON), Column("at", DateTime(timezone=True)),
              Column("_version", BigInteger, nullable=False))
    ts = {"type": "long", "logicalType": "timestamp-micros"}
    changed = {"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "long"}, {"name": "n", "type": ["null", "string"]}, {"name": "d", "type": "long"},
        {"name": "s", "type": "string"}, {"name": "j", "type": {"type": "array", "items": "long"}},
        {"name": "at", "type": ts}]}
    plan = plan_fit(changed, t, postgresql.dialect(), skip={"id", "_version"})
    assert [(r.field, r.sql_type, r.avro_type) for r in plan.retyped] == [("n", "BIGINT", "string"),
                                                                          ("d", "DATE", "integer")]
    # what the columns take: no change
    same = {**changed, "fields": [f for f in changed["fields"] if f["name"] not in ("n", "d")]}
    assert plan_fit(same, t, postgresql.dialect(), skip={"id", "_version"}).retyped == []


def test_the_reason_suggests_evolve_table_for_numeric_columns_only() -> None:
    from connectors.rds.sink_fit import FieldCheck

    varchar = FieldCheck("name", "varchar(5)", "string", max_length=5).reason()
    assert "evolve_table widens numeric columns only" in varchar and "set evolve_table: true" not in varchar
    decimal = FieldCheck("price", "numeric(5,2)", "decimal(9,4)", scale=2).reason()
    assert "set evolve_table: true on the sink to widen numeric columns" in decimal
