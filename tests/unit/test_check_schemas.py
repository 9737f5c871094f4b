"""``threes check``'s pipeline checks: the checks of ``validate`` with the writer schemas of the schema topic.

The logic is pure: the schema topic is an :class:`~schemas.store.InMemorySchemaStore` here (its
``version_schemas`` is what :class:`~schemas.store.SchemaStore` gives ``threes check``); the real
topic is in ``tests/integration/test_check_schemas.py``.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from schemas import load_schema
from schemas.store import InMemorySchemaStore
from threes.cli import app
from threes.config import load_pipeline
from threes.schemas_check import left_to_check, schema_problems

from .stream_app.test_plan import FLIGHT

PIPELINE = """\
version: 1
kafka:
  bootstrap_servers: 127.0.0.1:19092
connections:
  pg: {type: rds, url: "postgresql+psycopg://threes@127.0.0.1:15432/threes"}
stream:
  events: {topic: flights, value_schema: schemas/flight.avsc}
  snapshots:
    - {name: airports, topics: [state.airports]}
  lookups:
    - snapshot: airports
      on: {origin: faa}
      prefix: origin_
      fields: [name, tz]
  derive:
    local_hour: "origin_tz + 1"
  enriched_topic: flights.enriched
  dead_letter_topic: flights.dlq
  updates:
    - {topic: updates.flights, kind: projection, key: [flight_id], fields: [flight_id, origin_name]}
  checkpoint_location: cp
sync:
  - name: warehouse
    dead_letter_topic: updates.dlq
    sinks:
      - name: flights-table
        type: rds_sink
        connection: pg
        topics: [updates.flights]
        table: flights
        key: [flight_id]
"""


def _config(tmp_path, text=PIPELINE):
    (tmp_path / "schemas").mkdir(exist_ok=True)
    (tmp_path / "schemas" / "flight.avsc").write_text(json.dumps(FLIGHT))
    config = tmp_path / "pipeline.yaml"
    config.write_text(text)
    return config


def _store(key=None, value=None):
    """The subjects a source of ``state.airports`` records: its key and value schemas."""
    store = InMemorySchemaStore()
    store.add_version("state.airports-key", key or load_schema("nycflights13/airport_key"))
    store.add_version("state.airports-value", value or load_schema("nycflights13/airport"))
    return store


def _line(config, text):
    return next(i for i, line in enumerate(config.read_text().splitlines(), 1) if text in line)


def _problems(config, store):
    return [str(p) for p in schema_problems(load_pipeline(config, environ={}), config, store.version_schemas)]


def test_a_matching_pipeline_has_no_problems_with_the_writer_schemas(tmp_path):
    assert _problems(_config(tmp_path), _store()) == []


def test_a_typo_in_a_lookups_fields_is_found_with_the_writer_schemas_only(tmp_path):
    config = _config(tmp_path, PIPELINE.replace("fields: [name, tz]", "fields: [nmae, tz]"))
    pipeline = load_pipeline(config, environ={})
    # validate: the snapshot's fields are unknown, but the lookup's are known by name, and origin_name is not one
    assert [(p.path, p.message.split(" (have")[0]) for p in schema_problems(pipeline, config)] == [
        ("stream.updates[0].fields", "no field 'origin_name' in the enriched event")]
    problems = _problems(config, _store())
    line = _line(config, "fields: [nmae, tz]")
    assert problems == [f"{config}:{line}: stream.lookups[0].fields: no field 'nmae' in the value schema of "
                        f"snapshot airports"]


def test_a_typo_in_a_snapshot_key_and_in_an_expression_reading_a_looked_up_column(tmp_path):
    config = _config(tmp_path, PIPELINE.replace("{origin: faa}", "{origin: fa}").replace(
        "origin_tz + 1", "origin_tzz + 1"))
    # validate knows the lookup's columns by name (fields: [name, tz]): origin_tzz is none of them
    assert [p.path for p in schema_problems(load_pipeline(config, environ={}), config)] == ["stream.derive.local_hour"]
    problems = "\n".join(_problems(config, _store()))
    assert f"{config}:{_line(config, '{origin: fa}')}: stream.lookups[0].on.origin: no field 'fa' in the key " \
           f"schema of snapshot airports" in problems
    # the lookup itself is wrong, so the columns it adds are unknown: the derive that reads them is not judged
    config = _config(tmp_path, PIPELINE.replace("origin_tz + 1", "origin_tzz + 1"))
    problems = "\n".join(_problems(config, _store()))
    assert f"{config}:{_line(config, 'origin_tzz')}: stream.derive.local_hour: no column 'origin_tzz'" in problems


def test_a_sink_key_not_in_the_update_topic_is_found_with_the_writer_schemas_only(tmp_path):
    text = PIPELINE.replace("        key: [flight_id]\n", "        key: [flight]\n")
    config = _config(tmp_path, text)
    line = _line(config, "key: [flight]")
    expected = [f"{config}:{line}: sync[0].sinks[0].key: no field 'flight' in the key of update topic "
                f"'updates.flights' (have: ['flight_id'])"]
    # the update's key is the YAML's: validate finds it without the writer schemas too
    assert [str(p) for p in schema_problems(load_pipeline(config, environ={}), config)] == expected
    problems = _problems(config, _store())
    assert problems == [f"{config}:{line}: sync[0].sinks[0].key: no field 'flight' in the key of update topic "
                        f"'updates.flights' (have: ['flight_id'])"]


def test_a_writer_schema_the_reader_cannot_read_and_a_subject_without_versions(tmp_path):
    config = _config(tmp_path)
    assert "no key schema recorded for topic(s) ['state.airports']" in "\n".join(
        _problems(config, InMemorySchemaStore()))
    # the first version is read with the latest: one that lacks a field the latest has, without a default
    store = _store()
    older = load_schema("nycflights13/airport")
    older = {**older, "fields": [f for f in older["fields"] if f["name"] != "alt"]}
    store.add_version("state.airports-value", older)
    store.add_version("state.airports-value", load_schema("nycflights13/airport"))
    assert "stream.snapshots[0].value_schema: topic 'state.airports': writer record" in "\n".join(
        _problems(config, store))


def test_validate_names_what_it_left_to_check_and_passes(tmp_path):
    config = _config(tmp_path, PIPELINE.replace("fields: [name, tz]", "fields: [nmae, name, tz]"))
    result = CliRunner().invoke(app, ["validate", str(config)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert ("note: stream.snapshots[0] (airports): its fields are checked by `threes check` (schemas in the "
            "schema topic)") in result.output
    # with reader schemas there is nothing left to check
    assert left_to_check(load_pipeline(_config(tmp_path, PIPELINE.replace(
        "topics: [state.airports]}",
        "topics: [state.airports], key_schema: nycflights13/airport_key, value_schema: nycflights13/airport}")),
        environ={})) == []
