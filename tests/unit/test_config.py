"""Config loading: good files, each kind of bad file, secret masking."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from connectors.rds.connection import RdsConnection
from kernel.exceptions import ConfigError
from threes.cli import app
from threes.config import load_pipeline, pipeline_from_dict

EXAMPLE = Path(__file__).parents[2] / "examples" / "pipeline.yaml"

MINIMAL = """\
version: 1
kafka:
  bootstrap_servers: 127.0.0.1:19092
connections:
  pg:
    type: rds
    url: postgresql+psycopg://threes@127.0.0.1:15432/threes
    password: ${env:THREES_PGPASS}
sources:
  - name: airports
    type: rds_source
    connection: pg
    topic: state.airports
    table: airports
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def problems(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [str(p) for p in exc.value.problems]


def test_example_pipeline_validates():
    pipeline = load_pipeline(EXAMPLE, environ={})
    assert [s.type for s in pipeline.sources] == ["rds_source", "elasticsearch_source", "s3_source"]
    assert pipeline.stream.lookups[0].on == {"customer_id": "id"}  # `on` stays a string key
    assert [svc.name for svc in pipeline.sync] == ["search", "warehouse"]
    # the default of ${env:NAME:-default} applies when the variable is unset
    assert pipeline.connections["postgres"].password.get_secret_value() == "threes"


def test_minimal_file_with_env_secret(tmp_path):
    pipeline = load_pipeline(write(tmp_path, MINIMAL), environ={"THREES_PGPASS": "s3cr3t"})
    conn = pipeline.connections["pg"]
    assert conn.password.get_secret_value() == "s3cr3t"
    assert conn.sqlalchemy_url().password == "s3cr3t"
    assert pipeline.sources[0].mode == "bulk"


def test_unknown_key_names_file_line_and_path(tmp_path):
    text = MINIMAL.replace("    table: airports\n", "    table: airports\n    tabel: oops\n")
    with pytest.raises(ConfigError) as exc:
        load_pipeline(write(tmp_path, text), environ={"THREES_PGPASS": "x"})
    assert problems(exc) == [
        f"{tmp_path / 'pipeline.yaml'}:15: sources[0].tabel: unknown key (not allowed here; check the spelling)"
    ]


def test_wrong_type_and_missing_key_reported_together(tmp_path):
    text = MINIMAL.replace(
        "    table: airports\n", "    table: airports\n    poll_interval_s: soon\n"
    ) + textwrap.dedent(
        """\
        sync:
          - name: search
            sinks:
              - {name: s, type: elasticsearch_sink, connection: pg, topics: [u]}
        """
    )
    with pytest.raises(ConfigError) as exc:
        load_pipeline(write(tmp_path, text), environ={"THREES_PGPASS": "x"})
    found = problems(exc)
    f = tmp_path / "pipeline.yaml"
    assert any(p.startswith(f"{f}:15: sources[0].poll_interval_s: Input should be a valid number") for p in found)
    assert f"{f}:17: sync[0].dead_letter_topic: Field required" in found
    assert f"{f}:19: sync[0].sinks[0].index: Field required" in found
    assert len(found) == 3


def test_reference_to_missing_or_wrong_connection(tmp_path):
    text = MINIMAL + (
        "  - name: planes\n"
        "    type: elasticsearch_source\n"
        "    connection: pg\n"
        "    topic: state.planes\n"
        "    index: planes\n"
        "  - name: airlines\n"
        "    type: s3_source\n"
        "    connection: nowhere\n"
        "    topic: state.airlines\n"
        "    bucket: b\n"
        "    format: csv\n"
        "    key: [carrier]\n"
    )
    with pytest.raises(ConfigError) as exc:
        load_pipeline(write(tmp_path, text), environ={"THREES_PGPASS": "x"})
    f = tmp_path / "pipeline.yaml"
    assert problems(exc) == [
        f"{f}:17: sources[1].connection: elasticsearch_source needs a connection of type 'elasticsearch', 'pg' is 'rds'",
        f"{f}:22: sources[2].connection: no connection named 'nowhere' (have: ['pg'])",
    ]


def test_unknown_connector_type(tmp_path):
    text = MINIMAL.replace("type: rds_source", "type: rds_sauce")
    with pytest.raises(ConfigError) as exc:
        load_pipeline(write(tmp_path, text), environ={"THREES_PGPASS": "x"})
    (problem,) = problems(exc)
    assert problem.startswith(f"{tmp_path / 'pipeline.yaml'}:11: sources[0].type: Input tag 'rds_sauce'")
    assert "'rds_source'" in problem


def test_broken_yaml_gives_line(tmp_path):
    text = MINIMAL.replace("  pg:\n", "  pg: [\n")
    with pytest.raises(ConfigError) as exc:
        load_pipeline(write(tmp_path, text), environ={"THREES_PGPASS": "x"})
    (problem,) = problems(exc)
    assert problem.startswith(f"{tmp_path / 'pipeline.yaml'}:")
    assert "broken YAML" in problem


def test_duplicate_key_is_an_error(tmp_path):
    text = MINIMAL.replace("    table: airports\n", "    table: airports\n    table: planes\n")
    with pytest.raises(ConfigError) as exc:
        load_pipeline(write(tmp_path, text), environ={"THREES_PGPASS": "x"})
    assert problems(exc) == [f"{tmp_path / 'pipeline.yaml'}:15: sources[0].table: duplicate key"]


def test_missing_env_and_file_references(tmp_path):
    text = MINIMAL.replace("table: airports", "table: ${file:table.txt}")
    with pytest.raises(ConfigError) as exc:
        load_pipeline(write(tmp_path, text), environ={})
    found = problems(exc)
    f = tmp_path / "pipeline.yaml"
    assert (
        found[0]
        == f"{f}:8: connections.pg.password: environment variable THREES_PGPASS is not set (referenced as ${{env:THREES_PGPASS}})"
    )
    assert found[1].startswith(f"{f}:14: sources[0].table: cannot read ${{file:table.txt}}")
    assert len(found) == 2  # the unresolved table is not reported again as "needs `table`"


def test_file_reference_relative_to_config(tmp_path):
    (tmp_path / "table.txt").write_text("airports_v2\n")
    text = MINIMAL.replace("table: airports", "table: ${file:table.txt}")
    pipeline = load_pipeline(write(tmp_path, text), environ={"THREES_PGPASS": "x"})
    assert pipeline.sources[0].table == "airports_v2"


def test_secrets_never_printed(tmp_path):
    text = MINIMAL.replace("threes@127", "threes:hunter2@127").replace("    password: ${env:THREES_PGPASS}\n", "")
    text += "    poll_interval_s: never\n"
    with pytest.raises(ConfigError) as exc:
        load_pipeline(write(tmp_path, text), environ={})
    assert "hunter2" not in str(exc.value)
    conn = RdsConnection(type="rds", url="postgresql+psycopg://u:hunter2@h/db")
    assert "hunter2" not in repr(conn) and "hunter2" not in str(conn) and "hunter2" not in conn.url
    assert conn.password.get_secret_value() == "hunter2"
    with pytest.raises(ConfigError) as exc2:
        pipeline_from_dict({"kafka": {"bootstrap_servers": "x", "client_config": {"sasl.password": "hunter2"}}})
    assert "hunter2" not in str(exc2.value)
    assert "looks like a secret" in str(exc2.value)


def test_cli_validate_exit_codes(tmp_path):
    runner = CliRunner()
    ok = runner.invoke(app, ["validate", str(EXAMPLE)])
    assert ok.exit_code == 0, ok.output
    assert "3 source(s)" in ok.output
    bad = write(tmp_path, MINIMAL.replace("topic: state.airports", "topic: [oops"))
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 1
    assert "broken YAML" in result.output and "Traceback" not in result.output


def test_cli_schema_is_json_schema():
    import json

    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False
    source_types = {ref["$ref"].rsplit("/", 1)[-1] for ref in schema["properties"]["sources"]["items"]["oneOf"]}
    assert source_types == {"RdsSourceConfig", "ElasticsearchSourceConfig", "S3SourceConfig"}


def test_elasticsearch_source_refuses_a_key_other_than_id(tmp_path):
    text = MINIMAL.replace(
        "connections:\n", "connections:\n  es:\n    type: elasticsearch\n    hosts: [http://127.0.0.1:19200]\n"
    ) + (
        "  - name: planes\n"
        "    type: elasticsearch_source\n"
        "    connection: es\n"
        "    topic: state.planes\n"
        "    index: planes\n"
        "    mode: snapshot\n"
        "    key: [tailnum]\n"
    )
    with pytest.raises(ConfigError) as exc:
        load_pipeline(write(tmp_path, text), environ={"THREES_PGPASS": "x"})
    [problem] = problems(exc)
    assert problem.startswith(f"{tmp_path / 'pipeline.yaml'}:")
    assert "sources[1]" in problem and "`key` ['tailnum'] is not supported" in problem and "_id" in problem
    # `key: [_id]` says what the connector does anyway, so it is accepted.
    pipeline = load_pipeline(write(tmp_path, text.replace("key: [tailnum]", "key: [_id]")), environ={"THREES_PGPASS": "x"})
    assert pipeline.sources[1].key == ["_id"]
