"""RdsSource's column-wise batches on real PostgreSQL: the same bytes as the per-record path, through Kafka."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from connectors.rds.connection import RdsConnection
from connectors.rds.source import RdsSource
from connectors.runtime.columnar import ColumnarEncoder
from schemas.serde import AvroSerializer
from tests.integration.sources.rds import source_pipeline
from threes.testing.source import run_once, topic_state

UTC = dt.UTC
ROWS = 2_500  # more than one page of batch_records


def _fill(pg_engine: Any, table: str) -> None:
    with pg_engine.begin() as c:
        c.execute(
            text(
                f"CREATE TABLE {table} (id bigint PRIMARY KEY, small smallint, big bigint, price numeric(20,6), "
                "plain numeric, ratio double precision, r real, flag boolean, at timestamptz NOT NULL, "
                "local_at timestamp, day date, t time, doc jsonb, raw bytea, uid uuid, note varchar(10), "
                "name text NOT NULL)"
            )
        )
        # every 7th row all nulls; negative, large and small values around the encodings' edges
        c.execute(
            text(
                f"INSERT INTO {table} SELECT g, "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE (g % 65536 - 32768)::smallint END, "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE (g - 1250) * 7378697629483820 END, "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE (g - 1250) * 1234567.891234 END, "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE round((g - 1250) / 128.0, 7) END, "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE g / 3.0 END, "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE (g / 7.0)::real END, "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE g % 2 = 0 END, "
                "timestamptz '1969-12-31 23:00:00+02' + g * interval '1 hour 1 microsecond', "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE timestamp '2013-03-10 01:59:59.5' + g * interval '1 minute' END, "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE date '1960-01-01' + g * 11 END, "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE time '00:00:00.000001' + g * interval '17 seconds' END, "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE jsonb_build_object('g', g, 'l', jsonb_build_array(1, 'é')) END, "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE decode(lpad(to_hex(g), 8, '0'), 'hex') END, "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE md5(g::text)::uuid END, "
                "CASE WHEN g % 7 = 0 THEN NULL ELSE left('n' || g, 10) END, "
                "repeat('é', g % 5) || g "
                "FROM generate_series(1, :n) g"
            ),
            {"n": ROWS},
        )


@pytest.mark.parametrize("reader", ["adbc", "psycopg"])
def test_pages_are_column_wise_and_encode_to_the_per_record_bytes(
    pg_engine: Any, pg: RdsConnection, kafka: Any, unique: str, reader: str
) -> None:
    """ADBC reads pages as Arrow when no column needs a Python converter; with ``jsonb``/``uuid``, psycopg does."""
    table = f"columnar_{reader}_{unique}"
    _fill(pg_engine, table)
    if reader == "adbc":
        with pg_engine.begin() as c:
            c.execute(text(f"ALTER TABLE {table} DROP COLUMN doc, DROP COLUMN uid"))
    pipeline = source_pipeline(
        kafka, pg, name=f"col-{unique}", topic=f"state.{unique}", table=table, mode="bulk", batch_records=1_000
    )
    config = pipeline.sources[0]
    source = RdsSource(config, pipeline.connections["pg"], kafka=pipeline.kafka)
    schemas = source.open(None)
    assert source._use_adbc == (reader == "adbc")
    try:
        batches = [b for b in source.poll() if b.records or b.columns is not None]
        with source.engine.connect() as c:
            rows = c.exec_driver_sql(f"SELECT * FROM {table} ORDER BY id").fetchall()  # our table
    finally:
        source.close()
    assert [b.columns is not None for b in batches] == [True, True, True]
    assert [b.columns.num_rows for b in batches] == [1_000, 1_000, 500]
    key_ser, value_ser = AvroSerializer(schemas.key), AvroSerializer(schemas.value)
    encoder = ColumnarEncoder(schemas.value, value_ser.header, schemas.key, key_ser.header)
    keys: list[bytes] = []
    values: list[bytes] = []
    for b in batches:
        k, v = encoder.encode(b.columns)
        keys += k
        values += v
    expected = [source.to_value(r) for r in rows]  # the per-record path's values (its converters applied)
    assert len(values) == len(expected) == ROWS
    for got_key, got_value, value in zip(keys, values, expected, strict=True):
        assert got_value == value_ser(value), value
        assert got_key == key_ser({"id": value["id"]})


def test_the_column_wise_path_through_kafka(
    pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str
) -> None:
    table = f"columnar_k_{unique}"
    _fill(pg_engine, table)
    topic = f"state.{unique}"
    (stats,) = run_once(
        source_pipeline(kafka, pg, name=f"colk-{unique}", topic=topic, table=table, mode="bulk", batch_records=1_000)
    ).values()
    assert stats.state == "caught_up", stats.error
    assert stats.acked == ROWS
    state = topic_state(kafka_conf, topic)
    assert len(state) == ROWS
    assert state[(7,)] == {
        "id": 7,
        **{k: None for k in state[(7,)] if k not in ("id", "at", "name")},
        "at": dt.datetime(1969, 12, 31, 21, 0, tzinfo=UTC) + 7 * dt.timedelta(hours=1, microseconds=1),
        "name": "éé7",
    }
    assert state[(1250,)]["price"] == decimal.Decimal("0.000000")
    assert state[(1,)]["big"] == -1249 * 7378697629483820
    assert state[(1,)]["price"] == decimal.Decimal("-1541975296.151266")
    assert state[(2,)]["doc"] == '{"g":2,"l":[1,"é"]}'
    assert state[(2,)]["raw"] == b"\x00\x00\x00\x02"
    assert state[(2,)]["uid"] == uuid.UUID("c81e728d-9d4c-2f63-6f06-7f89cc14862c")
    assert state[(2,)]["t"] == dt.time(0, 0, 34, 1)
    assert state[(2,)]["local_at"] == dt.datetime(2013, 3, 10, 2, 1, 59, 500000)


def test_a_record_the_producer_refuses_stops_the_task_before_its_batch_s_position(
    pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str
) -> None:
    """A column-wise batch is queued in one produce_batch call; a refused record fails the task, no position past it."""
    import threading

    from connectors.runtime.offsets import OffsetStore
    from connectors.runtime.standalone import SourceWorker, task_specs

    table = f"refused_{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v text NOT NULL)"))
        c.execute(
            text(
                f"INSERT INTO {table} SELECT g, CASE WHEN g = 1500 THEN repeat('x', 20000) ELSE 'v' || g END "
                "FROM generate_series(1, 3000) g"
            )
        )
    offsets_topic = f"_offsets.{unique}"
    pipeline = source_pipeline(
        kafka,
        pg,
        name=f"ref-{unique}",
        topic=f"state.{unique}",
        table=table,
        mode="bulk",
        batch_records=1_000,
        reconcile_interval_s=None,
    )
    worker = SourceWorker(pipeline, offsets_topic=offsets_topic, producer_overrides={"message_max_bytes": 10_000})
    (spec,) = task_specs(pipeline.sources)
    worker.start(spec, once=True)
    worker.wait(threading.Event())
    (stats,) = worker.stats().values()
    assert stats.state == "failed"
    assert "refused by the producer" in (stats.error or "") and "too large" in (stats.error or "").lower()
    stored = OffsetStore(kafka_conf, offsets_topic).load(f"ref-{unique}")
    assert stored == {"mode": "bulk", "after": [1000]}  # the first page, acknowledged; never the refused one's
    ids = {k[0] for k in topic_state(kafka_conf, f"state.{unique}")}
    assert set(range(1, 1001)) <= ids and 1500 not in ids and not ids & set(range(2001, 3001))
