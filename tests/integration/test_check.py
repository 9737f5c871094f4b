"""`threes check` against the live stack, and against systems that are not there."""

from __future__ import annotations

import textwrap

from typer.testing import CliRunner

from threes.cli import app


def pipeline_yaml(tmp_path, endpoints, *, kafka=None, pg_port=None, bucket="missing-bucket"):
    pg_url = endpoints.postgres_url if pg_port is None else endpoints.postgres_url.replace(":15432/", f":{pg_port}/")
    text = textwrap.dedent(
        f"""\
        kafka:
          bootstrap_servers: {kafka or endpoints.kafka_bootstrap}
          request_timeout_s: 3
        connections:
          pg: {{type: rds, url: "{pg_url}", connect_timeout_s: 3}}
          es: {{type: elasticsearch, hosts: ["{endpoints.elasticsearch_url}"]}}
          s3:
            type: s3
            endpoint_url: {endpoints.s3_endpoint_url}
            access_key_id: {endpoints.s3_access_key_id}
            secret_access_key: {endpoints.s3_secret_access_key}
            path_style: true
        sources:
          - {{name: airlines, type: s3_source, connection: s3, topic: state.airlines, bucket: {bucket}, format: csv, key: [carrier]}}
        """
    )
    path = tmp_path / "check.yaml"
    path.write_text(text)
    return path


def test_check_all_ok(tmp_path, endpoints, s3, unique):
    bucket = f"check-{unique}"
    s3.create_bucket(Bucket=bucket)
    result = CliRunner().invoke(app, ["check", str(pipeline_yaml(tmp_path, endpoints, bucket=bucket))])
    assert result.exit_code == 0, result.output
    assert result.output.count("ok") >= 4 and "FAILED" not in result.output
    assert "threes-secret-key" not in result.output and "threes:threes" not in result.output


def test_check_says_what_failed_and_what_to_do(tmp_path, endpoints):
    path = pipeline_yaml(tmp_path, endpoints, kafka="127.0.0.1:1", pg_port=1)
    result = CliRunner().invoke(app, ["check", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    out = result.output
    assert out.count("FAILED") == 3, out  # kafka, postgres, the missing bucket; Elasticsearch is fine
    assert "threes local up" in out and "create bucket 'missing-bucket' first" in out
    assert "Traceback" not in out and "threes-secret-key" not in out


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_check_with_everything_down_is_one_line_per_problem_without_secrets(tmp_path):
    """Every system at a closed loopback port (as if stopped), secrets in a URL's query and userinfo."""
    import subprocess
    import sys
    from pathlib import Path

    port = _closed_port()
    path = tmp_path / "down.yaml"
    path.write_text(textwrap.dedent(f"""\
        kafka:
          bootstrap_servers: 127.0.0.1:{port}
          request_timeout_s: 2
        connections:
          pg: {{type: rds, url: "postgresql+psycopg://threes@127.0.0.1:{port}/threes?password=PgQuerySecret9",
               connect_timeout_s: 2}}
          es: {{type: elasticsearch, hosts: ["http://elastic:EsUserinfoSecret9@127.0.0.1:{port}"],
               request_timeout_s: 2}}
          s3:
            type: s3
            endpoint_url: http://127.0.0.1:{port}
            access_key_id: threes
            secret_access_key: S3SecretKey9
            path_style: true
        """))
    threes = Path(sys.executable).parent / "threes"
    for args in (["check"], ["--debug", "check"]):
        done = subprocess.run([str(threes), *args, str(path)], capture_output=True, text=True, timeout=120,
                              env={**__import__("os").environ, "COLUMNS": "250"})
        output = done.stdout + done.stderr
        assert done.returncode == 1, output
        for secret in ("PgQuerySecret9", "EsUserinfoSecret9", "S3SecretKey9"):
            assert secret not in output, (secret, output)
        assert "Traceback" not in output and "%3|" not in output and "%4|" not in output, output
        if args == ["check"]:
            lines = [line for line in done.stdout.splitlines() if line.strip()]
            assert len(lines) == 4, output  # kafka, pg, es, s3: one line each
            assert all(line.startswith("FAILED ") for line in lines), output
            assert [line.split()[1] for line in lines] == ["kafka", "rds", "elasticsearch", "s3"]
            assert done.stderr.strip().splitlines() == ["error 4 of 4 check(s) failed"], done.stderr


def test_a_bucket_the_sink_creates_is_not_a_failure(tmp_path, endpoints, s3, unique):
    source_bucket = f"check-{unique}"
    s3.create_bucket(Bucket=source_bucket)
    path = pipeline_yaml(tmp_path, endpoints, bucket=source_bucket)
    archive = f"archive-{unique}"  # does not exist; the sink creates it at start
    sink = textwrap.dedent(f"""\
        sync:
          - name: lake
            dead_letter_topic: updates.dlq
            sinks:
              - {{name: archive, type: s3_sink, connection: s3, topics: [updates.x], bucket: {archive}, create_bucket: true}}
        """)
    path.write_text(path.read_text() + sink)
    result = CliRunner().invoke(app, ["check", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"s3/{archive}: missing; created at start (create_bucket: true)" in result.output
    path.write_text(path.read_text().replace("create_bucket: true", "create_bucket: false"))
    result = CliRunner().invoke(app, ["check", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 1 and f"create bucket {archive!r} first" in result.output
