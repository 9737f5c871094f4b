"""Debezium change topics as snapshots: records shaped as Debezium's PostgreSQL connector writes them.

The envelope (before/after/source/op/ts_ms), its Avro schema names (``<server>.<schema>.<table>.Envelope``,
``Value``, ``Key``), the delete followed by a tombstone, and the ``__debezium_unavailable_value``
placeholder of a TOASTed column left out of an UPDATE follow Debezium's PostgreSQL connector documentation.
"""

from __future__ import annotations

import base64
import decimal
import json
import uuid

from schemas.debezium import UNAVAILABLE, connect_json, key_of, latest_values

NS = "dbserver1.inventory.customers"
VALUE = {"type": "record", "name": "Value", "namespace": NS, "fields": [
    {"name": "id", "type": "int"},
    {"name": "email", "type": "string"},
    {"name": "bio", "type": ["null", "string"], "default": None},  # a TOASTed text column
]}
SOURCE = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
    {"name": "version", "type": "string"}, {"name": "connector", "type": "string"},
    {"name": "name", "type": "string"}, {"name": "ts_ms", "type": "long"},
    {"name": "db", "type": "string"}, {"name": "schema", "type": "string"}, {"name": "table", "type": "string"},
    {"name": "txId", "type": ["null", "long"], "default": None},
    {"name": "lsn", "type": ["null", "long"], "default": None},
]}
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": NS, "fields": [
    {"name": "before", "type": ["null", VALUE], "default": None},
    {"name": "after", "type": ["null", f"{NS}.Value"], "default": None},
    {"name": "source", "type": SOURCE},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None},
]}
KEY = {"type": "record", "name": "Key", "namespace": NS, "fields": [{"name": "id", "type": "int"}]}


def _source(lsn: int) -> dict:
    return {"version": "2.7.0.Final", "connector": "postgresql", "name": "dbserver1", "ts_ms": 1_700_000_000_000,
            "db": "postgres", "schema": "inventory", "table": "customers", "txId": 500 + lsn, "lsn": lsn}


def _changes() -> list[tuple[dict, dict | None]]:
    """Inserts (snapshot read and create), updates, a TOASTed update, a delete and its tombstone."""
    long_bio = "x" * 10_000
    row = {"id": 1001, "email": "sally@example.com", "bio": long_bio}
    return [
        ({"id": 1001}, {"before": None, "after": row, "source": _source(1), "op": "r", "ts_ms": 1}),
        ({"id": 1002}, {"before": None, "after": {"id": 1002, "email": "george@example.com", "bio": "short"},
                        "source": _source(2), "op": "c", "ts_ms": 2}),
        ({"id": 1003}, {"before": None, "after": {"id": 1003, "email": "ed@example.com", "bio": None},
                        "source": _source(3), "op": "c", "ts_ms": 3}),
        # REPLICA IDENTITY DEFAULT: the unchanged TOASTed bio is not in the WAL record
        ({"id": 1001}, {"before": None, "after": {"id": 1001, "email": "sally@new.example.com", "bio": UNAVAILABLE},
                        "source": _source(4), "op": "u", "ts_ms": 4}),
        ({"id": 1002}, {"before": None, "after": {"id": 1002, "email": "g2@example.com", "bio": "changed"},
                        "source": _source(5), "op": "u", "ts_ms": 5}),
        ({"id": 1003}, {"before": {"id": 1003, "email": "ed@example.com", "bio": None}, "after": None,
                        "source": _source(6), "op": "d", "ts_ms": 6}),
        ({"id": 1003}, None),  # tombstones.on.delete
    ]


EXPECTED = {
    (1001,): {"id": 1001, "email": "sally@new.example.com", "bio": "x" * 10_000},
    (1002,): {"id": 1002, "email": "g2@example.com", "bio": "changed"},
}


def test_debezium_avro_topic_through_the_registry_is_the_latest_after_per_key():
    from confluent_kafka.schema_registry.avro import AvroSerializer as ConfluentAvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from schemas.registry import RegistryBridge, registry_client
    from schemas.serde import AvroDeserializer
    from schemas.store import InMemorySchemaStore

    client = registry_client({"url": f"mock://{uuid.uuid4().hex}"})
    topic = "dbserver1.inventory.customers"
    # what Debezium's AvroConverter writes: Confluent's serializer, TopicNameStrategy subjects
    key_ser = ConfluentAvroSerializer(client, json.dumps(KEY))
    value_ser = ConfluentAvroSerializer(client, json.dumps(ENVELOPE))
    wire = [(key_ser(k, SerializationContext(topic, MessageField.KEY)),
             value_ser(v, SerializationContext(topic, MessageField.VALUE)) if v is not None else None)
            for k, v in _changes()]
    store = InMemorySchemaStore()
    bridge = RegistryBridge(client, store)
    de = AvroDeserializer(store)
    changes = [(key_of(de(bridge.to_single_object(k))), de(bridge.to_single_object(v))) for k, v in wire]
    assert latest_values(changes) == EXPECTED


def _connect_json(schema: dict, payload: dict | None) -> bytes | None:
    return None if payload is None else json.dumps({"schema": schema, "payload": payload}).encode()


def test_debezium_connect_json_topic_with_struct_keys():
    value_schema = {"type": "struct", "optional": True, "name": f"{NS}.Value", "fields": [
        {"field": "id", "type": "int32", "optional": False},
        {"field": "email", "type": "string", "optional": False},
        {"field": "bio", "type": "string", "optional": True}]}
    envelope_schema = {"type": "struct", "name": f"{NS}.Envelope", "optional": False, "fields": [
        {"field": "before", **value_schema}, {"field": "after", **value_schema},
        {"field": "source", "type": "struct", "optional": False, "fields": []},
        {"field": "op", "type": "string", "optional": False},
        {"field": "ts_ms", "type": "int64", "optional": True}]}
    key_schema = {"type": "struct", "name": f"{NS}.Key", "optional": False,
                  "fields": [{"field": "id", "type": "int32", "optional": False}]}
    wire = [(_connect_json(key_schema, k), _connect_json(envelope_schema, v)) for k, v in _changes()]
    changes = [(key_of(connect_json(k)), connect_json(v)) for k, v in wire]
    assert latest_values(changes) == EXPECTED


def test_connect_json_logical_types():
    schema = {"type": "struct", "fields": [
        {"field": "amount", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
         "parameters": {"scale": "2"}},
        {"field": "day", "type": "int32", "name": "org.apache.kafka.connect.data.Date"},
        {"field": "at", "type": "int64", "name": "org.apache.kafka.connect.data.Timestamp"}]}
    amount = base64.b64encode((-12345).to_bytes(2, "big", signed=True)).decode()
    doc = connect_json(json.dumps({"schema": schema, "payload": {"amount": amount, "day": 1, "at": 1000}}))
    assert doc["amount"] == decimal.Decimal("-123.45")
    assert doc["day"].isoformat() == "1970-01-02" and doc["at"].isoformat() == "1970-01-01T00:00:01+00:00"


def test_toasted_column_without_a_previous_value_is_null():
    changes = [((1,), {"op": "u", "before": None, "after": {"id": 1, "bio": UNAVAILABLE}})]
    assert latest_values(changes) == {(1,): {"id": 1, "bio": None}}
