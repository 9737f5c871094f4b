"""``threes stream`` commands that need no Spark: schemas, and config errors of ``run``."""

from __future__ import annotations

import json
import textwrap

from typer.testing import CliRunner

from threes.cli import app

from .test_plan import FLIGHT

PIPELINE = """\
version: 1
kafka:
  bootstrap_servers: 127.0.0.1:19092
stream:
  events: {topic: flights, value_schema: flight.avsc}
  snapshots:
    - {name: airports, topics: [state.airports], key_schema: nycflights13/airport_key, value_schema: nycflights13/airport}
  lookups:
    - {snapshot: airports, on: {origin: faa}, prefix: origin_, fields: [name]}
  enriched_topic: flights.enriched
  dead_letter_topic: flights.dlq
  updates:
    - {topic: updates.flights, kind: projection, key: [flight_id]}
  checkpoint_location: cp
"""


def test_schemas_prints_what_the_job_writes(tmp_path):
    (tmp_path / "flight.avsc").write_text(json.dumps(FLIGHT))
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    result = CliRunner().invoke(app, ["stream", "schemas", str(tmp_path / "pipeline.yaml")])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["enriched"]["topic"] == "flights.enriched"
    assert out["enriched"]["schema"]["fields"][-1] == {"name": "origin_name", "type": ["null", "string"], "default": None}
    assert [f["name"] for f in out["updates.flights"]["key"]["fields"]] == ["flight_id"]


def test_schema_problems_are_config_errors_with_their_path(tmp_path):
    (tmp_path / "flight.avsc").write_text(json.dumps(FLIGHT))
    (tmp_path / "pipeline.yaml").write_text(PIPELINE.replace("{origin: faa}", "{nope: faa}"))
    result = CliRunner().invoke(app, ["stream", "schemas", str(tmp_path / "pipeline.yaml")])
    assert result.exit_code == 1
    assert "stream.lookups[0].on.nope: no column 'nope' in the event, the derive columns or an earlier lookup" in result.output


def test_a_file_without_a_stream_section_is_refused(tmp_path):
    (tmp_path / "pipeline.yaml").write_text(textwrap.dedent("""\
        version: 1
        kafka: {bootstrap_servers: 127.0.0.1:19092}
        """))
    result = CliRunner().invoke(app, ["stream", "run", str(tmp_path / "pipeline.yaml")])
    assert result.exit_code == 1 and "no `stream:` section" in result.output
