"""Unit tests of the source runtime's pure parts: position tracking, encode-error analysis, Avro helpers."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from connectors.runtime.avro import (
    CoercionError,
    avro_name,
    infer_record_schema,
    key_schema_from,
    record_coercer,
)
from connectors.runtime.offsets import PositionTracker, offsets_key
from connectors.runtime.produce import bad_fields
from kernel.exceptions import FatalError


class _Msg:
    def partition(self) -> int:
        return 2


def test_position_moves_only_over_a_fully_acknowledged_prefix() -> None:
    t = PositionTracker()
    a = t.add(2, {"p": 1})
    b = t.add(1, {"p": 2})
    c = t.add(1, None)  # a batch that does not move the position
    b.ack(None, _Msg())  # acks of a later batch arrive first (another partition)
    assert t.advance() == (None, 0) and t.committable is None
    a.ack(None, _Msg())
    assert t.advance() == (None, 0)
    a.ack(None, _Msg())
    assert t.advance() == ({"p": 2}, 3)
    assert t.in_flight == 1
    c.ack(None, _Msg())
    assert t.advance() == (None, 1)
    assert t.committable == {"p": 2}


def test_failed_delivery_stops_the_position_before_it() -> None:
    t = PositionTracker()
    a = t.add(1, {"p": 1}, "ctx-a")
    b = t.add(1, {"p": 2}, "ctx-b")
    a.ack(None, _Msg())
    b.ack("broker said no", _Msg())
    with pytest.raises(FatalError, match="ctx-b: delivery to partition 2 failed: broker said no"):
        t.advance()
    assert t.committable == {"p": 1}
    # on shutdown the error is not raised again, and nothing past it is committable
    assert t.advance(raise_errors=False) == (None, 0)
    assert t.committable == {"p": 1}


def test_abandoned_batch_owes_no_acks_and_never_commits() -> None:
    t = PositionTracker()
    a = t.add(3, {"p": 1})
    a.ack(None, _Msg())  # one record produced and acknowledged, then encoding failed
    t.abandon(a, 2, "cannot encode")
    assert t.in_flight == 0
    assert t.advance(raise_errors=False) == (None, 0)
    assert t.committable is None


def test_offsets_key() -> None:
    assert offsets_key("orders") == "orders"
    assert offsets_key("orders", 2, 4) == "orders#2"


def test_bad_fields_names_every_failing_field() -> None:
    schema = {"type": "record", "name": "r", "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "label", "type": "string"},
        {"name": "n", "type": ["null", "int"]},
    ]}
    found = bad_fields(schema, {"id": 1, "amount": decimal.Decimal("1.001"), "label": 5, "n": None})
    assert [f for f, _ in found] == ["amount", "label"]
    assert "Scale" in found[0][1]


def test_avro_name() -> None:
    assert avro_name("ok_name1") == "ok_name1"
    assert avro_name("unit price") == "unit_price"
    assert avro_name('x"; DROP TABLE y; --') == "x___DROP_TABLE_y____"
    assert avro_name("2024") == "_2024"
    assert avro_name("@timestamp") == "_timestamp"


def test_infer_record_schema() -> None:
    schema = infer_record_schema("t", [{"a": None, "b": 1, "c b": "x"}, {"a": 1.5, "b": 2, "d": True}],
                                 namespace="ns")
    types = {f["name"]: f["type"] for f in schema["fields"]}
    assert types == {"a": ["null", "double"], "b": ["null", "long"], "c_b": ["null", "string"],
                     "d": ["null", "boolean"]}
    assert schema["fields"][2]["source.field"] == "c b"


def test_record_coercer_converts_strings_and_names_the_field() -> None:
    schema = {"type": "record", "name": "r", "fields": [
        {"name": "id", "type": "long"},
        {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}]},
        {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
        {"name": "ok", "type": ["null", "boolean"]},
        {"name": "doc", "type": ["null", "string"], "source.field": "the doc"},
        {"name": "note", "type": ["null", "string"]},
    ]}
    coerce = record_coercer(schema, empty_is_null=True)
    assert coerce({"id": "7", "price": "1.25", "at": "2024-01-02T03:04:05Z", "day": "2024-01-02", "ok": "true",
                   "the doc": {"a": [1]}, "note": ""}) == {
        "id": 7, "price": decimal.Decimal("1.25"), "at": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "day": dt.date(2024, 1, 2), "ok": True, "doc": '{"a":[1]}', "note": "",
    }
    assert coerce({"id": "1", "price": ""})["price"] is None
    with pytest.raises(CoercionError, match="field 'id'"):
        coerce({"id": "seven"})
    with pytest.raises(CoercionError, match="field 'id': missing"):
        coerce({"price": "1"})


def test_key_schema_from_value_schema() -> None:
    value = {"type": "record", "name": "v", "namespace": "ns", "fields": [
        {"name": "a", "type": ["null", "string"]}, {"name": "b_c", "type": "long", "source.field": "b c"}]}
    assert key_schema_from(value, ["b c", "a"], "src") == {
        "type": "record", "name": "src_key", "namespace": "ns",
        "fields": [{"name": "b_c", "type": "long"}, {"name": "a", "type": "string"}]}
    with pytest.raises(KeyError):
        key_schema_from(value, ["nope"], "src")
