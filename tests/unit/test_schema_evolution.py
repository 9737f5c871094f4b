"""Schema identity with logical types, compatibility levels, key changes, internal topic settings (no services)."""

from __future__ import annotations

import decimal
import json
from pathlib import Path

import pytest
from fastavro.schema import to_parsing_canonical_form

from kernel.exceptions import ConfigError
from kernel.kafka.topics import replication_settings
from schemas.compatibility import Compatibility, check_compatibility, reader_writer_problems
from schemas.evolution import key_subject, plan_topic_schemas, value_subject
from schemas.exceptions import IncompatibleSchemaError, KeySchemaChangeError
from schemas.serde import AvroDeserializer, AvroSerializer, canonical_form, fingerprint, parsing_fingerprint
from schemas.store import InMemorySchemaStore

SHIPPED = Path(__file__).resolve().parents[2] / "schemas" / "nycflights13"


def record(*fields: dict) -> dict:
    return {"type": "record", "name": "row", "namespace": "t", "fields": list(fields)}


def decimal_field(scale: int, precision: int = 12) -> dict:
    return {"name": "amount", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                                "precision": precision, "scale": scale}], "default": None}


ID = {"name": "id", "type": "int"}


# -- identity -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (decimal_field(2), decimal_field(4)),
        (decimal_field(2, 12), decimal_field(2, 14)),
        ({"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
         {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}}),
        ({"name": "d", "type": {"type": "int", "logicalType": "date"}}, {"name": "d", "type": "int"}),
        ({"name": "u", "type": {"type": "string", "logicalType": "uuid"}}, {"name": "u", "type": "string"}),
    ],
)
def test_schemas_that_decode_differently_never_share_a_fingerprint(a: dict, b: dict) -> None:
    assert parsing_fingerprint(record(ID, a)) == parsing_fingerprint(record(ID, b))  # the old identity collided
    assert fingerprint(record(ID, a)) != fingerprint(record(ID, b))


def test_without_logical_types_the_fingerprint_is_the_parsing_canonical_forms() -> None:
    for path in SHIPPED.glob("*.avsc"):
        schema = json.loads(path.read_text())
        text = json.dumps(schema)
        if "logicalType" not in text:
            assert canonical_form(schema) == to_parsing_canonical_form(schema), path.name
            assert fingerprint(schema) == parsing_fingerprint(schema), path.name
    assert fingerprint('"int"') == (0x7275D51A3F395C8F).to_bytes(8, "little")  # the specification's vector


def test_decimal_scale_defaults_to_zero_and_docs_do_not_count() -> None:
    implicit = record({"name": "a", "type": {"type": "bytes", "logicalType": "decimal", "precision": 5}})
    explicit = record({"name": "a", "doc": "x", "type": {"type": "bytes", "logicalType": "decimal", "precision": 5,
                                                          "scale": 0}})
    assert fingerprint(implicit) == fingerprint(explicit)


def test_decimal_scale_change_round_trips_exactly_through_one_store() -> None:
    store = InMemorySchemaStore()
    v2, v4 = record(ID, decimal_field(2)), record(ID, decimal_field(4))
    old = AvroSerializer(v2, store)({"id": 1, "amount": decimal.Decimal("123.45")})
    new = AvroSerializer(v4, store)({"id": 2, "amount": decimal.Decimal("1.2345")})
    read = AvroDeserializer(store)
    assert read(old)["amount"] == decimal.Decimal("123.45")
    assert read(new)["amount"] == decimal.Decimal("1.2345")


def test_records_under_an_old_parsing_canonical_fingerprint_still_decode() -> None:
    """A schema topic written before the change maps the old fingerprint to the full schema."""
    store = InMemorySchemaStore()
    schema = record(ID, decimal_field(2))
    old_fp = parsing_fingerprint(schema)
    store._schemas[old_fp] = AvroSerializer(schema).schema  # what refresh() loads from an old record
    body = AvroSerializer(schema)({"id": 1, "amount": decimal.Decimal("9.99")})[10:]
    assert AvroDeserializer(store)(b"\xc3\x01" + old_fp + body)["amount"] == decimal.Decimal("9.99")


# -- compatibility --------------------------------------------------------------------------------------


def test_the_avro_library_decides_and_fields_are_named() -> None:
    v1 = record(ID, {"name": "name", "type": "string"})
    added_without_default = record(ID, {"name": "name", "type": "string"}, {"name": "n", "type": "long"})
    assert [f for f, _ in reader_writer_problems(added_without_default, v1)] == ["n"]
    narrowed = record({"name": "id", "type": "string"}, {"name": "name", "type": "string"})
    problems = reader_writer_problems(narrowed, v1)
    assert problems and problems[0][0] == "id" and "string" in problems[0][1]
    promoted = record({"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"], "default": None})
    assert reader_writer_problems(promoted, v1) == []


def test_a_logical_type_change_is_incompatible() -> None:
    problems = reader_writer_problems(record(ID, decimal_field(4)), record(ID, decimal_field(2)))
    assert problems == [("amount", "logical type changes from decimal(12,2) to decimal(12,4)")]


def test_a_decimal_that_becomes_a_string_is_incompatible() -> None:
    """Avro promotes bytes to string: a decimal's two's-complement bytes would be read as text (issue #49: an
    unbounded numeric once written as decimal(38,9) is now its exact text)."""
    text_field = {"name": "amount", "type": ["null", "string"], "default": None}
    ((path, problem),) = reader_writer_problems(record(ID, text_field), record(ID, decimal_field(2)))
    assert path == "amount" and "decimal(12,2) to string" in problem
    assert reader_writer_problems(record(ID, decimal_field(2)), record(ID, text_field))


@pytest.mark.parametrize(
    ("level", "ok"),
    [("NONE", True), ("BACKWARD", True), ("FORWARD", False), ("FULL", False), ("BACKWARD_TRANSITIVE", True)],
)
def test_levels_added_field_with_default_in_reader_only(level: str, ok: bool) -> None:
    """The new schema drops a field that has no default: old readers (FORWARD) miss it."""
    v1 = record(ID, {"name": "name", "type": "string"})
    v2 = record(ID)
    if ok:
        check_compatibility(v2, [v1], level, topic="t", subject="t-value")
    else:
        with pytest.raises(IncompatibleSchemaError) as exc:
            check_compatibility(v2, [v1], level, topic="t", subject="t-value")
        assert "'t'" in str(exc.value) and "'name'" in str(exc.value)


def test_transitive_checks_every_version() -> None:
    v1 = record(ID)
    v2 = record(ID, {"name": "n", "type": "long", "default": 0})
    v3 = record(ID, {"name": "n", "type": "long"})  # reads v2's data, not v1's (no default)
    check_compatibility(v3, [v1, v2], Compatibility.BACKWARD, topic="t", subject="t-value")
    with pytest.raises(IncompatibleSchemaError) as exc:
        check_compatibility(v3, [v1, v2], Compatibility.BACKWARD_TRANSITIVE, topic="t", subject="t-value")
    assert exc.value.problems[0][0] == "n" and "version 1" in exc.value.problems[0][1]


# -- subjects -------------------------------------------------------------------------------------------


KEY_INT = {"type": "record", "name": "row_key", "fields": [{"name": "id", "type": "int"}]}
KEY_LONG = {"type": "record", "name": "row_key", "fields": [{"name": "id", "type": "long"}]}


def _first(store: InMemorySchemaStore, key: dict, value: dict) -> None:
    plan = plan_topic_schemas(store, topic="t", connector="c", key_schema=key, value_schema=value)
    plan.record_value(store)
    plan.record_key(store)


def test_incompatible_value_is_refused_before_anything_is_registered() -> None:
    store = InMemorySchemaStore()
    _first(store, KEY_INT, record(ID))
    known = dict(store.schemas_json())
    with pytest.raises(IncompatibleSchemaError) as exc:
        plan_topic_schemas(store, topic="t", connector="c", key_schema=KEY_INT,
                           value_schema=record(ID, {"name": "n", "type": "long"}))
    assert exc.value.topic == "t" and exc.value.problems[0][0] == "n"
    assert store.schemas_json() == known and len(store.versions(value_subject("t"))) == 1


def test_key_change_is_refused_unless_rekey() -> None:
    store = InMemorySchemaStore()
    _first(store, KEY_INT, record(ID))
    with pytest.raises(KeySchemaChangeError) as exc:
        plan_topic_schemas(store, topic="t", connector="c", key_schema=KEY_LONG, value_schema=record(ID))
    assert "'t'" in str(exc.value) and "'id'" in str(exc.value) and "rekey: true" in str(exc.value)
    plan = plan_topic_schemas(store, topic="t", connector="c", key_schema=KEY_LONG, value_schema=record(ID),
                              rekey=True)
    assert plan.rekey and plan.old_key_fingerprints == [fingerprint(KEY_INT)]
    assert store.versions(key_subject("t")) == [fingerprint(KEY_INT)]  # recorded only after the re-key
    plan.record_key(store)
    assert store.versions(key_subject("t")) == [fingerprint(KEY_INT), fingerprint(KEY_LONG)]
    again = plan_topic_schemas(store, topic="t", connector="c", key_schema=KEY_LONG, value_schema=record(ID),
                               rekey=True)
    assert not again.rekey  # rekey: true left in the config does nothing once done


def test_same_schema_again_is_not_a_new_version() -> None:
    store = InMemorySchemaStore()
    _first(store, KEY_INT, record(ID))
    _first(store, KEY_INT, record(ID))
    assert len(store.versions(value_subject("t"))) == 1 and len(store.versions(key_subject("t"))) == 1


# -- internal topics ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("brokers", "rf", "isr", "expected"),
    [(1, None, None, (1, 1)), (2, None, None, (2, 1)), (3, None, None, (3, 2)), (6, None, None, (3, 2)),
     (5, 5, None, (5, 2)), (3, 3, 3, (3, 3))],
)
def test_replication_settings(brokers: int, rf: int | None, isr: int | None, expected: tuple[int, int]) -> None:
    assert replication_settings(brokers, rf, isr) == expected


def test_replication_settings_refuse_the_impossible() -> None:
    with pytest.raises(ConfigError, match="internal_replication_factor is 3 but the cluster has 1 broker"):
        replication_settings(1, 3)
    with pytest.raises(ConfigError, match="internal_min_insync_replicas is 3"):
        replication_settings(3, 2, 3)


def test_a_key_stored_under_its_old_fingerprint_keeps_it() -> None:
    """Upgrade: keys an older release framed with the Parsing Canonical Form fingerprint keep their bytes."""
    from schemas.serde import parse, schema_json

    key = {"type": "record", "name": "k", "fields": [{"name": "day", "type": {"type": "int", "logicalType": "date"}}]}
    store = InMemorySchemaStore()
    legacy = parsing_fingerprint(key)
    store._schemas[legacy], store._json[legacy] = parse(key), schema_json(key)  # what refresh() loads
    plan = plan_topic_schemas(store, topic="t", connector="c", key_schema=key, value_schema=record(ID))
    assert plan.key_fingerprint == legacy != fingerprint(key) and not plan.rekey
    plan.record_key(store)
    assert store.versions(key_subject("t")) == [legacy]
    again = plan_topic_schemas(store, topic="t", connector="c", key_schema=key, value_schema=record(ID))
    assert again.key_fingerprint == legacy and not again.rekey
    assert AvroSerializer(key, store, fp=legacy).header[2:] == legacy

    # a colliding schema stored first under that fingerprint does not count
    other = {**key, "fields": [{"name": "day", "type": "int"}]}
    fresh = InMemorySchemaStore()
    fresh._schemas[legacy], fresh._json[legacy] = parse(other), schema_json(other)
    assert plan_topic_schemas(fresh, topic="t", connector="c", key_schema=key,
                              value_schema=record(ID)).key_fingerprint == fingerprint(key)


def test_rekey_needs_one_task() -> None:
    store = InMemorySchemaStore()
    _first(store, KEY_INT, record(ID))
    with pytest.raises(KeySchemaChangeError, match="runs as one task: run the source once with `tasks: 1`"):
        plan_topic_schemas(store, topic="t", connector="c", key_schema=KEY_LONG, value_schema=record(ID),
                           rekey=True, tasks=2)


def test_a_topic_without_key_versions_is_judged_by_its_keys() -> None:
    """Versions lost or never recorded: the latest keys in the topic tell which key schema wrote them."""
    store = InMemorySchemaStore()
    store.register(KEY_INT)
    old_keys = [AvroSerializer(KEY_INT)({"id": 1})]
    with pytest.raises(KeySchemaChangeError, match="field 'id'"):
        plan_topic_schemas(store, topic="t", connector="c", key_schema=KEY_LONG, value_schema=record(ID),
                           topic_keys=lambda: old_keys)
    plan = plan_topic_schemas(store, topic="t", connector="c", key_schema=KEY_LONG, value_schema=record(ID),
                              topic_keys=lambda: old_keys, rekey=True)
    assert plan.rekey and plan.key_fingerprint == fingerprint(KEY_LONG)
    same = plan_topic_schemas(store, topic="t", connector="c", key_schema=KEY_INT, value_schema=record(ID),
                              topic_keys=lambda: old_keys)
    assert not same.rekey
    empty = plan_topic_schemas(store, topic="t", connector="c", key_schema=KEY_LONG, value_schema=record(ID),
                               topic_keys=list)
    assert not empty.rekey


def test_the_topic_decides_between_old_and_new_key_fingerprints() -> None:
    from schemas.serde import parse, schema_json

    key = {"type": "record", "name": "k", "fields": [{"name": "day", "type": {"type": "int", "logicalType": "date"}}]}
    store = InMemorySchemaStore()
    legacy = parsing_fingerprint(key)
    store._schemas[legacy], store._json[legacy] = parse(key), schema_json(key)
    store.register(key)
    new_keys = [b"\xc3\x01" + fingerprint(key) + b"\x02"]
    old_keys = [b"\xc3\x01" + legacy + b"\x02"]
    for keys, expected in ((new_keys, fingerprint(key)), (old_keys, legacy), ([], legacy)):
        plan = plan_topic_schemas(store, topic="t", connector="c", key_schema=key, value_schema=record(ID),
                                  topic_keys=lambda keys=keys: keys)
        assert plan.key_fingerprint == expected and not plan.rekey


def test_a_narrowing_change_names_the_field_s_old_and_new_types() -> None:
    from schemas.compatibility import Compatibility, check_compatibility
    from schemas.exceptions import IncompatibleSchemaError

    old = {"type": "record", "name": "R", "fields": [{"name": "x", "type": "double"}]}
    new = {"type": "record", "name": "R", "fields": [{"name": "x", "type": "float"}]}
    with pytest.raises(IncompatibleSchemaError) as err:
        check_compatibility(new, [old], Compatibility.BACKWARD, topic="t", subject="t-value")
    assert "field 'x': values written as double cannot be read as float" in str(err.value)
