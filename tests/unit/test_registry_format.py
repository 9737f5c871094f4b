"""The Confluent wire format through confluent-kafka's in-memory ``mock://`` Schema Registry client."""

from __future__ import annotations

import struct
import uuid

import pytest
from confluent_kafka.schema_registry.avro import AvroSerializer as ConfluentAvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from schemas.exceptions import IncompatibleSchemaError, UnknownSchemaError
from schemas.registry import RegistryBridge, RegistrySerializer, registry_client
from schemas.serde import AvroDeserializer, fingerprint
from schemas.store import InMemorySchemaStore
from threes.config import pipeline_from_dict

V1 = {"type": "record", "name": "Customer", "namespace": "t", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"], "default": None}]}
V2_COMPATIBLE = {**V1, "fields": [*V1["fields"], {"name": "tier", "type": "string", "default": "basic"}]}
V2_INCOMPATIBLE = {**V1, "fields": [*V1["fields"], {"name": "tier", "type": "string"}]}


def _client():
    return registry_client({"url": f"mock://{uuid.uuid4().hex}"})


def test_serializer_registers_under_topic_name_strategy_and_writes_the_confluent_prefix():
    client = _client()
    ser = RegistrySerializer(client, "state.customers", V1)
    data = ser({"id": 7, "name": "Ada"})
    assert data[:1] == b"\x00"
    assert struct.unpack(">I", data[1:5])[0] == ser.schema_id
    assert client.get_latest_version("state.customers-value").schema_id == ser.schema_id
    assert ser(None) is None


def test_bridge_reads_the_registry_format_with_the_single_object_decoders():
    client = _client()
    data = RegistrySerializer(client, "t1", V1)({"id": 7, "name": "Ada"})
    store = InMemorySchemaStore()
    single = RegistryBridge(client, store).to_single_object(data)
    assert single[:2] == b"\xc3\x01" and single[2:10] == fingerprint(V1)
    assert AvroDeserializer(store, reader_schema=V2_COMPATIBLE)(single) == {"id": 7, "name": "Ada", "tier": "basic"}


def test_bridge_reads_what_confluents_own_serializer_wrote():
    """A topic produced by another team with confluent-kafka's AvroSerializer (auto-registering)."""
    client = _client()
    import json

    theirs = ConfluentAvroSerializer(client, json.dumps(V2_COMPATIBLE))
    data = theirs({"id": 1, "name": None, "tier": "gold"}, SerializationContext("orders", MessageField.VALUE))
    store = InMemorySchemaStore()
    decoded = AvroDeserializer(store)(RegistryBridge(client, store).to_single_object(data))
    assert decoded == {"id": 1, "name": None, "tier": "gold"}


def test_bridge_leaves_single_object_bytes_and_tombstones_alone():
    bridge = RegistryBridge(_client(), InMemorySchemaStore())
    assert bridge.to_single_object(None) is None
    assert bridge.to_single_object(b"\xc3\x01" + b"x" * 12) == b"\xc3\x01" + b"x" * 12


def test_unknown_schema_id_is_an_unknown_schema_error():
    bridge = RegistryBridge(_client(), InMemorySchemaStore())
    with pytest.raises(UnknownSchemaError):
        bridge.to_single_object(b"\x00\x00\x00\x03\xe7" + b"\x02")


def test_incompatible_schema_is_refused_before_registration():
    client = _client()
    RegistrySerializer(client, "t2", V1)
    with pytest.raises(IncompatibleSchemaError, match="tier"):
        RegistrySerializer(client, "t2", V2_INCOMPATIBLE)  # no default: old records cannot be read
    assert sorted(client.get_versions("t2-value")) == [1]  # nothing registered by the refused one
    RegistrySerializer(client, "t2", V2_COMPATIBLE)  # with a default: BACKWARD compatible
    assert sorted(client.get_versions("t2-value")) == [1, 2]


def _pipeline(**kafka):
    return {
        "kafka": {"bootstrap_servers": "127.0.0.1:19092", **kafka},
        "connections": {"pg": {"type": "rds", "url": "postgresql+psycopg://u:p@127.0.0.1:15432/db"}},
        "sources": [{"name": "c", "type": "rds_source", "connection": "pg", "topic": "state.c", "table": "c",
                     "value_format": "confluent_avro", "key_format": "confluent_avro"}],
    }


def test_confluent_avro_source_needs_a_registry():
    from schemas.exceptions import ConfigError

    with pytest.raises(ConfigError, match="kafka.schema_registry"):
        pipeline_from_dict(_pipeline())
    pipe = pipeline_from_dict(_pipeline(schema_registry={"url": "http://127.0.0.1:18081",
                                                         "auth": {"username": "u", "password": "s3cret"}}))
    conf = pipe.kafka.schema_registry.client_config()
    assert conf["url"] == "http://127.0.0.1:18081" and conf["basic.auth.user.info"] == "u:s3cret"
    assert "s3cret" not in repr(pipe.kafka)


def test_default_format_is_unchanged():
    data = _pipeline()
    del data["sources"][0]["value_format"], data["sources"][0]["key_format"]
    pipe = pipeline_from_dict(data)
    assert pipe.sources[0].value_format == "avro" and pipe.kafka.schema_registry is None


def test_consumed_messages_are_rewritten_for_the_sync_services_decoders():
    """What SyncService.step does to a consumed batch of a confluent_avro update topic."""
    from confluent_kafka import Message

    from schemas.columnar import ColumnarDecoder

    client = _client()
    key_ser = RegistrySerializer(client, "updates.c", {"type": "record", "name": "K", "fields": [
        {"name": "id", "type": "long"}]}, is_key=True)
    value_ser = RegistrySerializer(client, "updates.c", V1)
    msgs = [Message(topic="updates.c", partition=0, offset=i, key=key_ser({"id": i}),
                    value=value_ser({"id": i, "name": f"n{i}"}) if i != 2 else None) for i in range(4)]
    msgs.append(Message(topic="updates.c", partition=0, offset=4, key=key_ser({"id": 4}),
                        value=b"\x00\x00\x00\x27\x0f" + b"\x02"))  # an id the registry does not have
    store = InMemorySchemaStore()
    RegistryBridge(client, store).convert_messages(msgs)
    assert msgs[2].value() is None and msgs[4].value()[:1] == b"\x00"  # tombstone kept; unknown id left to the DLQ
    assert all(m.key()[:2] == b"\xc3\x01" for m in msgs)
    table = ColumnarDecoder(store).decode(fingerprint(V1), [m.value()[10:] for m in (msgs[0], msgs[1], msgs[3])])
    assert table.column("name").to_pylist() == ["n0", "n1", "n3"]


def test_dlq_show_decodes_a_dead_letter_written_in_the_registry_format():
    """``threes dlq show`` on a pipeline with a registry: Confluent-framed bytes decode, not hex."""
    from threes.dead_letter_values import decode, registry_decoder

    client = _client()
    framed = RegistrySerializer(client, "updates.customers", V1)({"id": 7, "name": "Ada"})
    store = InMemorySchemaStore()
    plain = AvroDeserializer(store)
    assert decode(framed, plain)[0] == "hex"  # without the registry: shown as bytes
    assert decode(framed, registry_decoder(plain, RegistryBridge(client, store))) == (
        "avro", {"id": 7, "name": "Ada"})
