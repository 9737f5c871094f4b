"""Spark's from_avro reads what RdsSource writes: every mapped SQL type, decoded in the JVM."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from schemas.serde import split
from schemas.store import SchemaStore
from threes.testing.source import run_once

pytestmark = pytest.mark.spark


def test_spark_from_avro_reads_rds_types(spark: Any, pg_engine: Any, pg: Any, kafka: Any, kafka_conf: Any,
                                         unique: str) -> None:
    from confluent_kafka import Consumer, TopicPartition

    from stream_app.avro import decode_avro
    from threes.config import pipeline_from_dict

    table = f"spark_{unique}"
    topic = f"state.{unique}"
    u = uuid.uuid4()
    with pg_engine.begin() as c:
        c.execute(text(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, small smallint, price numeric(20,6), loose numeric, "
            "ratio double precision, flag boolean, at timestamptz, local_at timestamp, day date, doc jsonb, "
            "raw bytea, uid uuid, tags text[])"
        ))
        c.execute(text(
            f"INSERT INTO {table} VALUES (1, 7, 12345678901234.123456, 0.12345678901, 0.25, true, "
            "'2024-02-29 23:59:59.123456+02', '2024-02-29 23:59:59.5', '1999-12-31', '{\"a\": [1]}', "
            "'\\xdeadbeef', :u, ARRAY['x', NULL]), (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
            "NULL, NULL)"
        ), {"u": u})
    pipeline = pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "connections": {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}},
        "sources": [{"name": f"spark-{unique}", "type": "rds_source", "connection": "pg", "topic": topic,
                     "table": table}],
    })
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error

    # the writer schema of the values, as the schema topic holds it
    consumer = Consumer({**kafka_conf, "group.id": f"t-{unique}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    msg = consumer.poll(30)
    consumer.close()
    fingerprint = split(msg.value())[0]
    # that writer only: every schema the topic holds would make one CASE branch each (thousands on a long-lived
    # Kafka, more than Spark's code generation fits in the heap)
    value_schema = SchemaStore(kafka_conf).schemas_json()[fingerprint]
    writers = {fingerprint: value_schema}
    assert json.loads(value_schema)["fields"][0]["name"] == "id"

    df = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka_conf["bootstrap.servers"])
          .option("subscribe", topic).option("startingOffsets", "earliest").load())
    rows = {r["v"]["id"]: r["v"] for r in
            df.select(decode_avro(df.value, writers, value_schema).alias("v")).collect()}
    assert set(rows) == {1, 2}
    one = rows[1].asDict(recursive=True)
    assert one == {
        "id": 1, "small": 7, "price": decimal.Decimal("12345678901234.123456"),
        "loose": "0.12345678901", "ratio": 0.25, "flag": True,  # unbounded numeric: its exact text (issue #49)
        "at": dt.datetime(2024, 2, 29, 21, 59, 59, 123456),  # the session time zone is UTC
        "local_at": dt.datetime(2024, 2, 29, 23, 59, 59, 500000), "day": dt.date(1999, 12, 31),
        "doc": '{"a":[1]}', "raw": bytearray(b"\xde\xad\xbe\xef"), "uid": str(u), "tags": ["x", None],
    }
    assert all(v is None for k, v in rows[2].asDict().items() if k != "id")
    # the text casts to whatever DECIMAL the job chooses, every digit kept
    decoded = df.select(decode_avro(df.value, writers, value_schema).alias("v"))
    cast = {r["id"]: r["d"] for r in decoded.selectExpr("v.id AS id", "CAST(v.loose AS DECIMAL(38, 11)) AS d").collect()}
    assert cast == {1: decimal.Decimal("0.12345678901"), 2: None}
