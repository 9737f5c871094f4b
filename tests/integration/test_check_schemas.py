"""``threes check`` checks the stream job and the sinks against the writer schemas of a real schema topic.

Each test has its own schema topic (``kafka.schema_topic``) and snapshot topic names: the writer
schemas are recorded as a source records them (:meth:`schemas.store.SchemaStore.add_version`).
"""

from __future__ import annotations

import json
import textwrap

from typer.testing import CliRunner

from kernel.kafka.topics import cluster_metadata
from schemas import load_schema
from schemas.store import SchemaStore
from threes.cli import app

FLIGHT = {
    "type": "record",
    "name": "Flight",
    "namespace": "threes.test",
    "fields": [
        {"name": "flight_id", "type": "long"},
        {"name": "origin", "type": "string"},
        {"name": "dep_delay", "type": ["null", "double"], "default": None},
    ],
}


def _pipeline(tmp_path, endpoints, unique, *, fields="[name, tz]", sink_key="[flight_id]"):
    (tmp_path / "flight.avsc").write_text(json.dumps(FLIGHT))
    path = tmp_path / "pipeline.yaml"
    path.write_text(textwrap.dedent(f"""\
        version: 1
        kafka:
          bootstrap_servers: {endpoints.kafka_bootstrap}
          request_timeout_s: 5
          schema_topic: _schemas.{unique}
        connections:
          pg: {{type: rds, url: "{endpoints.postgres_url}", connect_timeout_s: 5}}
        stream:
          events: {{topic: flights.{unique}, value_schema: flight.avsc}}
          snapshots:
            - {{name: airports, topics: [state.airports.{unique}]}}
          lookups:
            - snapshot: airports
              on: {{origin: faa}}
              prefix: origin_
              fields: {fields}
          enriched_topic: flights.enriched.{unique}
          dead_letter_topic: flights.dlq.{unique}
          updates:
            - {{topic: updates.flights.{unique}, kind: projection, key: [flight_id], fields: [flight_id, origin_name]}}
          checkpoint_location: cp
        sync:
          - name: warehouse
            dead_letter_topic: updates.dlq.{unique}
            sinks:
              - name: flights-table
                type: rds_sink
                connection: pg
                topics: [updates.flights.{unique}]
                table: flights_{unique}
                key: {sink_key}
        """))
    return path


def _record_writer_schemas(kafka_conf, unique):
    """What the source of ``state.airports.<unique>`` records in the schema topic (which it creates)."""
    store = SchemaStore(kafka_conf, f"_schemas.{unique}")
    store.add_version(f"state.airports.{unique}-key", load_schema("nycflights13/airport_key"))
    store.add_version(f"state.airports.{unique}-value", load_schema("nycflights13/airport"))


def _line(path, text):
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _run(*args):
    return CliRunner().invoke(app, list(map(str, args)), env={"COLUMNS": "300"})


def test_check_finds_what_validate_leaves_to_it(tmp_path, endpoints, kafka_conf, unique):
    _record_writer_schemas(kafka_conf, unique)
    # 'nmae' is a column the lookup declares: only the snapshot's writer schema says it does not exist
    path = _pipeline(tmp_path, endpoints, unique, fields="[nmae, name, tz]")

    validated = _run("validate", path)
    assert validated.exit_code == 0, validated.output
    assert ("note: stream.snapshots[0] (airports): its fields are checked by `threes check` "
            "(schemas in the schema topic)") in validated.output

    checked = _run("check", path)
    assert checked.exit_code == 1, checked.output
    out = checked.output
    assert (f"FAILED config {path}:{_line(path, 'fields: [nmae, name, tz]')}: stream.lookups[0].fields: no field "
            f"'nmae' in the value schema of snapshot airports") in out, out
    # a sink key the update's key lacks: the YAML says what the key is, so validate finds it, and check too
    fixed = _pipeline(tmp_path, endpoints, unique, sink_key="[flight]")
    validated = _run("validate", fixed)
    assert validated.exit_code == 1 and "sync[0].sinks[0].key: no field 'flight'" in validated.output
    out = _run("check", fixed).output
    assert (f"FAILED config {fixed}:{_line(fixed, 'key: [flight]')}: sync[0].sinks[0].key: no field 'flight' in "
            f"the key of update topic 'updates.flights.{unique}' (have: ['flight_id'])") in out, out
    assert "ok     kafka" in out and "ok     rds pg" in out and "Traceback" not in out


def test_check_passes_a_pipeline_that_matches_the_writer_schemas(tmp_path, endpoints, kafka_conf, unique):
    _record_writer_schemas(kafka_conf, unique)
    result = _run("check", _pipeline(tmp_path, endpoints, unique))
    assert result.exit_code == 0, result.output
    assert f"ok     config {tmp_path / 'pipeline.yaml'}: lookups, expressions, updates and sink keys match" \
           in result.output


def test_check_says_the_schema_topic_is_missing_and_creates_nothing(tmp_path, endpoints, kafka_conf, unique):
    result = _run("check", _pipeline(tmp_path, endpoints, unique))
    assert result.exit_code == 1
    assert (f"FAILED schemas _schemas.{unique}: schema topic '_schemas.{unique}' does not exist: no writer "
            f"schemas for snapshot(s) ['airports'] → start the sources") in result.output, result.output
    topics = cluster_metadata(kafka_conf, 10).topics
    assert not [t for t in topics if unique in t]  # read-only: neither the schema topic nor any other
