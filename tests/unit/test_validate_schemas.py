"""``threes validate`` checks the schemas: paths from the config's folder, lookups, types, file:line for each."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from kernel.exceptions import ConfigError
from stream_app.plan import build_plan
from threes.cli import app
from threes.config import load_pipeline

from .stream_app.test_plan import FLIGHT

PIPELINE = """\
version: 1
kafka:
  bootstrap_servers: 127.0.0.1:19092
stream:
  events: {topic: flights, value_schema: schemas/flight.avsc}
  snapshots:
    - {name: airports, topics: [state.airports], key_schema: nycflights13/airport_key, value_schema: nycflights13/airport}
  lookups:
    - snapshot: airports
      on: {origin: faa}
      prefix: origin_
  enriched_topic: flights.enriched
  dead_letter_topic: flights.dlq
  updates:
    - {topic: updates.flights, kind: projection, key: [flight_id]}
    - topic: updates.delays
      kind: aggregation
      group_by: [origin]
      event_time: time_hour
      aggregations:
        total: sum(dep_delay)
  checkpoint_location: cp
"""


def _folder(tmp_path, text=PIPELINE):
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "flight.avsc").write_text(json.dumps(FLIGHT))
    config = tmp_path / "pipeline.yaml"
    config.write_text(text)
    return config


def _validate(config):
    return CliRunner().invoke(app, ["validate", str(config)], env={"COLUMNS": "300"})


def _line(config, text):
    return next(i for i, line in enumerate(config.read_text().splitlines(), 1) if text in line)


def test_a_valid_config_is_ok_from_any_working_directory(tmp_path, monkeypatch):
    config = _folder(tmp_path / "project" if (tmp_path / "project").mkdir() is None else tmp_path)
    monkeypatch.chdir(tmp_path)  # not the config's folder: relative paths still start there
    result = _validate(config)
    assert result.exit_code == 0, result.output
    assert "ok" in result.output


def test_misspelled_value_schema_path_fails_with_file_and_line(tmp_path):
    config = _folder(tmp_path, PIPELINE.replace("schemas/flight.avsc", "schemas/flihgt.avsc"))
    result = _validate(config)
    assert result.exit_code == 1
    assert f"{config}:{_line(config, 'flihgt')}: stream.events.value_schema: Avro schema" in result.output
    assert str(tmp_path / "schemas" / "flihgt.avsc") in result.output  # where it looked: the config's folder


def test_lookup_on_a_missing_event_field_fails_with_file_and_line(tmp_path):
    config = _folder(tmp_path, PIPELINE.replace("{origin: faa}", "{orgin: faa}"))
    result = _validate(config)
    assert result.exit_code == 1
    line = _line(config, "{orgin: faa}")
    assert f"{config}:{line}: stream.lookups[0].on.orgin: no column 'orgin' in the event" in result.output


def test_aggregation_over_a_wrong_type_fails_with_file_and_line(tmp_path):
    config = _folder(tmp_path, PIPELINE.replace("sum(dep_delay)", "sum(carrier)"))
    result = _validate(config)
    assert result.exit_code == 1
    line = _line(config, "sum(carrier)")
    assert f"{config}:{line}: stream.updates[1].aggregations.total: field 'carrier' is not numeric" in result.output


def test_all_problems_are_reported_at_once(tmp_path):
    text = PIPELINE.replace("{origin: faa}", "{orgin: faa}").replace("event_time: time_hour", "event_time: carrier")
    config = _folder(tmp_path, text)
    result = _validate(config)
    assert result.exit_code == 1
    assert "stream.lookups[0].on.orgin" in result.output and "stream.updates[1].event_time" in result.output


def test_relative_source_and_sink_schemas_start_at_the_config_folder(tmp_path, monkeypatch):
    config = _folder(tmp_path / "p" if (tmp_path / "p").mkdir() is None else tmp_path, PIPELINE + """\
connections:
  pg: {type: rds, url: postgresql://threes@127.0.0.1:15432/threes}
sources:
  - {name: flights_q, type: rds_source, connection: pg, topic: state.flights, mode: query,
     query: select 1, key: [flight_id], value_schema: schemas/flight.avsc}
""")
    monkeypatch.chdir(tmp_path)
    pipeline = load_pipeline(config, environ={})
    assert pipeline.sources[0].value_schema == str(config.parent / "schemas" / "flight.avsc")
    assert pipeline.stream.events.value_schema == str(config.parent / "schemas" / "flight.avsc")
    assert pipeline.stream.snapshots[0].value_schema == "nycflights13/airport"  # a shipped schema stays a name
    os.remove(config.parent / "schemas" / "flight.avsc")
    result = _validate(config)
    assert result.exit_code == 1
    assert f"{config}:{_line(config, 'query: select 1')}: sources[0].value_schema: Avro schema" in result.output


def test_a_snapshot_without_reader_schemas_validates_its_event_side(tmp_path):
    text = PIPELINE.replace(", key_schema: nycflights13/airport_key, value_schema: nycflights13/airport", "")
    config = _folder(tmp_path, text)
    assert _validate(config).exit_code == 0
    pipeline = load_pipeline(config, environ={})
    assert build_plan(pipeline.stream, None, config.parent) is None  # the rest needs the topics' schemas
    bad = _folder(tmp_path / "b" if (tmp_path / "b").mkdir() is None else tmp_path,
                  text.replace("{origin: faa}", "{orgin: faa}"))
    with pytest.raises(ConfigError, match="no column 'orgin' in the event"):
        build_plan(load_pipeline(bad, environ={}).stream, None, bad.parent)
