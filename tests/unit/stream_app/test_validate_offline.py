"""What ``threes validate`` checks from the YAML alone, with snapshots whose schemas only the topics know.

Each lookup lists its ``fields``, so the columns it adds are known by name: a chained ``on``, an
update's ``where`` or ``group_by`` and a sink's key naming another column can never exist. One bad
``derive`` is reported once, at its root, not once per use; a model check names the key's own line.
"""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from threes.cli import app

HEAD = """\
version: 1
kafka:
  bootstrap_servers: 127.0.0.1:19092
stream:
  name: j
  events: {topic: flights, value_schema: nycflights13/flight}
  enriched_topic: en
  dead_letter_topic: dl
  checkpoint_location: cp
"""

LOOKUPS = """\
  snapshots:
    - {name: airports, topics: [state.airports]}
    - {name: planes, topics: [state.planes]}
  lookups:
    - {snapshot: airports, on: {origin: faa}, prefix: origin_, fields: [name, tz]}
    - {snapshot: planes, on: {ORIGIN_NAME: tailnum}, prefix: plane_, fields: [model]}
  updates:
    - {topic: u1, kind: projection, key: [flight, origin], where: "WHERE_COLUMN = 'x'"}
    - {topic: u2, kind: aggregation, group_by: [GROUP_BY], event_time: time_hour, window: 1 hour,
       aggregations: {n: count}}
connections:
  pg: {type: rds, url: "postgresql+psycopg://threes@127.0.0.1:15432/threes"}
sync:
  - name: s
    dead_letter_topic: s.dlq
    sinks:
      - {name: w, type: rds_sink, connection: pg, topics: [u2], table: t, key: [origin_name, WINDOW]}
"""


def validate(tmp_path: Path, text: str) -> tuple[int, list[str]]:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["validate", str(path)])
    return result.exit_code, [line for line in result.output.splitlines() if line.strip()]


def lookups(**names: str) -> str:
    text = HEAD + LOOKUPS
    for placeholder, name in names.items():
        text = text.replace(placeholder, name)
    return text


def test_columns_no_lookup_makes_are_errors_even_when_only_the_topics_know_the_schemas(tmp_path: Path) -> None:
    code, lines = validate(tmp_path, lookups(ORIGIN_NAME="origin_nme", WHERE_COLUMN="origin_tzz",
                                             GROUP_BY="origin_nam", WINDOW="window_start"))
    assert code == 1
    errors = [line for line in lines if line.startswith("error")]
    assert any(":15: stream.lookups[1].on.origin_nme: no column 'origin_nme'" in e for e in errors), errors
    assert any(":17: stream.updates[0].where:" in e and "no column 'origin_tzz'" in e for e in errors), errors
    assert any(":18: stream.updates[1].group_by: no field 'origin_nam'" in e for e in errors), errors
    assert len(errors) == 3, errors


def test_a_sink_key_is_checked_against_the_update_key_the_yaml_makes(tmp_path: Path) -> None:
    code, lines = validate(tmp_path, lookups(ORIGIN_NAME="origin_name", WHERE_COLUMN="origin_tz",
                                             GROUP_BY="origin_name", WINDOW="window_strat"))
    assert code == 1
    assert any("sync[0].sinks[0].key: no field 'window_strat' in the key of update topic 'u2' "
               "(have: ['origin_name', 'window_start'])" in line for line in lines), lines


def test_a_correct_pipeline_passes_and_says_what_it_leaves_to_check(tmp_path: Path) -> None:
    code, lines = validate(tmp_path, lookups(ORIGIN_NAME="origin_name", WHERE_COLUMN="origin_tz",
                                             GROUP_BY="origin_name", WINDOW="window_start"))
    assert code == 0, lines
    notes = [line for line in lines if line.startswith("note:")]
    assert "note: stream.lookups[0]: its columns origin_{name, tz} are checked by name here; their types, and " \
           "that airports has those fields, by `threes check`" in notes, notes


def test_one_bad_derive_is_reported_once_at_its_root(tmp_path: Path) -> None:
    text = HEAD + """\
  derive: {speed: "distance / air_tme * 60", fast: "speed > 500", label: "concat(carrier, speed)"}
  updates:
    - {topic: u1, kind: projection, key: [flight, origin], where: "fast", fields: [speed, label, fast]}
    - {topic: u2, kind: aggregation, group_by: [origin], event_time: time_hour, window: 1 hour,
       aggregations: {m: mean(speed), x: max(speed)}}
"""
    code, lines = validate(tmp_path, text)
    errors = [line for line in lines if line.startswith("error")]
    assert code == 1 and len(errors) == 1, errors
    assert "stream.derive.speed: no column 'air_tme'" in errors[0]


def test_a_real_cycle_is_still_reported(tmp_path: Path) -> None:
    code, lines = validate(tmp_path, HEAD + '  derive: {a: "b + 1", b: "a + 1"}\n')
    assert code == 1
    assert any("derive.a" in line and "written after it" in line for line in lines), lines


def test_as_of_without_retention_is_reported_at_the_lookup(tmp_path: Path) -> None:
    text = HEAD + """\
  snapshots:
    - {name: airports, topics: [state.airports]}
  lookups:
    - {snapshot: airports, on: {origin: faa}, prefix: origin_, fields: [name], as_of: time_hour}
"""
    code, lines = validate(tmp_path, text)
    assert code == 1
    assert any(":13: stream.lookups[0].as_of: snapshot 'airports' keeps no versions" in line for line in lines), lines
