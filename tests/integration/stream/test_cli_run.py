"""``threes stream run CONFIG --available-now`` end to end: its own Spark (a subprocess), real Kafka."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import FLIGHT, end_offsets, flight

pytestmark = pytest.mark.spark


def test_cli_runs_the_job_from_yaml(env, kafka, tmp_path):
    env.put_airport("EWR")
    env.put_flights([flight(1, "EWR", "LAX"), flight(2, "XXX", "LAX")])
    (tmp_path / "flight.avsc").write_text(json.dumps(FLIGHT))
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        textwrap.dedent(f"""\
        version: 1
        kafka:
          bootstrap_servers: {kafka.bootstrap_servers}
        stream:
          name: cli-{env.unique}
          events: {{topic: {env.events}, value_schema: flight.avsc, starting_offsets: earliest}}
          snapshots:
            - name: airports
              topics: [{env.airports}]
              key_schema: nycflights13/airport_key
              value_schema: nycflights13/airport
          lookups:
            - {{snapshot: airports, on: {{origin: faa}}, prefix: origin_, how: inner, fields: [name]}}
          enriched_topic: {env.enriched}
          dead_letter_topic: {env.dlq}
          checkpoint_location: {tmp_path / "checkpoint"}
          spark: {{master: "local[1]", driver_memory: 1g}}
        """)
    )
    threes = Path(sys.executable).parent / "threes"
    done = subprocess.run(
        [str(threes), "-v", "stream", "run", str(config), "--available-now"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "snapshot=airports ready keys=1" in done.stderr
    # flight 2's origin is unknown: inner join
    assert sum(end_offsets(env.conf, env.enriched).values()) == 1, done.stderr[-6000:]
    got = env.consume(env.enriched, lambda rs: len(rs) >= 1)
    assert [(r["value"]["flight_id"], r["value"]["origin_name"]) for r in got] == [(1, "Newark Liberty Intl")]


def test_cli_runs_the_job_on_the_cluster_with_an_s3a_checkpoint(
    env, kafka, tmp_path, spark_cluster_master, spark_sessions, endpoints, s3, stack
):
    """``threes stream run`` as a user runs it on the standalone cluster: code zip, jars, s3a from the YAML."""
    if spark_sessions.master == spark_cluster_master:
        spark_sessions.close()  # the test process's own application would hold both cores
    bucket = f"cli-{env.unique}"
    s3.create_bucket(Bucket=bucket)
    env.put_airport("EWR")
    env.put_flights([flight(1, "EWR", "LAX"), flight(2, "XXX", "LAX")])
    (tmp_path / "flight.avsc").write_text(json.dumps(FLIGHT))
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        textwrap.dedent(f"""\
        version: 1
        kafka:
          bootstrap_servers: {kafka.bootstrap_servers}
        stream:
          name: cli-{env.unique}
          events: {{topic: {env.events}, value_schema: flight.avsc, starting_offsets: earliest}}
          snapshots:
            - name: airports
              topics: [{env.airports}]
              key_schema: nycflights13/airport_key
              value_schema: nycflights13/airport
              index_min_rows: 0
          lookups:
            - {{snapshot: airports, on: {{origin: faa}}, prefix: origin_, how: inner, fields: [name]}}
          enriched_topic: {env.enriched}
          dead_letter_topic: {env.dlq}
          checkpoint_location: s3a://{bucket}/cp
          spark:
            master: {spark_cluster_master}
            driver_memory: 1g
            conf:
              spark.hadoop.fs.s3a.endpoint: {endpoints.s3_endpoint_url}
              spark.hadoop.fs.s3a.endpoint.region: {endpoints.s3_region}
              spark.hadoop.fs.s3a.path.style.access: "true"
              spark.hadoop.fs.s3a.connection.ssl.enabled: "false"
              spark.hadoop.fs.s3a.access.key: ${{env:THREES_TEST_S3_KEY}}
              spark.hadoop.fs.s3a.secret.key: ${{env:THREES_TEST_S3_SECRET}}
        """)
    )
    threes = Path(sys.executable).parent / "threes"
    environ = {
        **os.environ,
        "THREES_TEST_S3_KEY": endpoints.s3_access_key_id,
        "THREES_TEST_S3_SECRET": endpoints.s3_secret_access_key,
        "THREES_HOME": str(stack.home),
    }  # the stack's jars (Spark connectors, hadoop-aws), run from elsewhere
    done = subprocess.run(
        [str(threes), "-v", "stream", "run", str(config), "--available-now"],
        capture_output=True,
        text=True,
        timeout=600,
        env=environ,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"spark session master={spark_cluster_master}" in done.stderr
    assert "snapshot=airports ready keys=1 mode=indexed" in done.stderr  # the index lives in executors' workers
    got = env.consume(env.enriched, lambda rs: len(rs) >= 1)
    assert [(r["value"]["flight_id"], r["value"]["origin_name"]) for r in got] == [(1, "Newark Liberty Intl")]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="cp/")["Contents"]]
    assert any(k.startswith("cp/events/commits/") for k in keys)
    assert any(k.startswith("cp/snapshots/airports/") for k in keys)
    assert endpoints.s3_secret_access_key not in done.stderr
    # Spark logs through log4j: hadoop-aws's SDK bundle (with an slf4j 1.x inside) comes after Spark's jars
    assert 'Setting default log level to "WARN"' in done.stderr
